"""Training pieces: the run's Keras callbacks, optimizers and schedules, losses, metrics, step tracing.

Plain arguments in, Keras objects out: nothing here reads the config.
"""
