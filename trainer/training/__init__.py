"""Training pieces: the run's Keras callbacks, optimizers and schedules, losses, metrics, compiling, step tracing.

Plain arguments in, Keras objects out: nothing here reads the Hydra config. `compiling.compile_model` alone takes
the typed settings (`Config`) that a task hands it.
"""
