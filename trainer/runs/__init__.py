"""Run folders: claiming them, locking them, atomic files, history.csv, the backup, resume, checkpoints.

Everything a run writes goes through here, so a kill, a full disk or a second process never leaves a
half-written file or a folder two runs share.
"""
