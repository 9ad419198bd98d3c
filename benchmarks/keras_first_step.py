"""The start-up floor: Keras alone, from `import tensorflow, keras` to the first training step of the network that
`python run.py debug=smoke` trains. No trainer code runs but the network's builder (plain Keras layers).

    python -m benchmarks.keras_first_step [POLICY] [--collector-paused]   # prints "First training step done"

POLICY (default float32) is the Keras mixed-precision policy, the one `run.py debug=smoke` picked.
`--collector-paused` imports TensorFlow and Keras as run.py does (`trainer.quiet.collector_paused`): the floor
like for like, once the import's own saving is taken out of the comparison.

The same network (debug=smoke's eighth-width VGG19 with batch norm and 64 fc units), Adam, sparse
cross-entropy and accuracy, batches of 16 32x32 float images from memory: what is left of the start-up once
the trainer's own work (config, data set-up, run folder, callbacks) is taken away. Most of it is Keras
tracing the training step and TensorFlow optimizing its graph, which no trainer on Keras's `fit` avoids.
"""

from __future__ import annotations

import contextlib
import sys

CLASSES, SIZE, BATCH, STEPS = 10, 32, 16, 4  # the digits at debug=smoke
PAUSED = "--collector-paused"


def main(policy: str = "float32") -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    from trainer.models.vgg19 import build_vgg19

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:
                print("First training step done", flush=True)

    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)
    model = build_vgg19(CLASSES, (SIZE, SIZE, 3), width_multiplier=0.125, fc_units=64)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    images = rng.random((BATCH * STEPS, SIZE, SIZE, 3), dtype=np.float32)
    labels = rng.integers(0, CLASSES, BATCH * STEPS)
    batches = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH)
    # At its best: the metrics' and the optimizer's variables built before fit, or Keras traces the step twice
    # without a strategy (docs/development.md, the ledger's row 4; run.py does the same).
    model.compute_metrics(images[:BATCH], labels[:BATCH], model(images[:BATCH], training=False))
    model.reset_metrics()
    model.optimizer.build(model.trainable_variables)
    model.fit(batches, epochs=1, verbose=0, callbacks=[FirstStep()])


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if PAUSED in arguments:
        from trainer.quiet import collector_paused

        pause = collector_paused()
    else:
        pause = contextlib.nullcontext()
    with pause:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    main(*[argument for argument in arguments if argument != PAUSED][:1])
