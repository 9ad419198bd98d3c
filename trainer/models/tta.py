"""Test-time augmentation: the mean of the probabilities of each image and of its mirror image.

    python run.py mode=evaluate checkpoint=RUN evaluate.tta=flip
    python run.py mode=predict checkpoint=RUN predict.input=photos/ predict.tta=flip
    python run.py evaluate.tta=flip        # the test evaluation at the end of training too

`with_tta` wraps a loaded inference model in a Keras model that calls it twice, on the
batch and on the batch flipped left to right, and averages the two outputs; the wrapper
is built where it is used and never saved.
"""

from __future__ import annotations

import keras

from trainer.models import TTA


def with_tta(model: keras.Model, tta: str = "none") -> keras.Model:
    """`model` itself for `none`; for `flip`, a model that returns the mean of `model(x)` and
    `model(x mirrored)` (call inside the strategy scope)."""
    if tta == "none":
        return model
    if tta != "flip":
        raise ValueError(f"tta must be one of {TTA}. Received: tta={tta}")
    image = keras.Input(shape=model.input_shape[1:], dtype=model.inputs[0].dtype, name="image")
    mirrored = keras.ops.flip(image, axis=2)  # [batch, height, width, channels]: left to right
    mean = keras.layers.Average(name="flip_tta", dtype="float32")([model(image), model(mirrored)])
    return keras.Model(image, mean, name=f"{model.name}_flip_tta")
