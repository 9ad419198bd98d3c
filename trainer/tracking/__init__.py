"""What people read about a run: trackers (MLflow, W&B), TensorBoard extras, curves, contact sheets, reports,
and the sweep callbacks Hydra calls.
"""
