"""Training pieces: the run's Keras callbacks, optimizers and schedules, losses, metrics, compiling, step tracing.

Plain arguments in, Keras objects out: nothing here reads the config (`tests/test_layout.py` refuses an import of
`trainer.config`); `trainer.tasks.phases.compile_phase` hands `compiling` what the config says.
"""
