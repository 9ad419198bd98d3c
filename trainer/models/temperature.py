"""Temperature scaling baked into a model: softmax(log(p) / T), the calibrated probabilities.

    python run.py mode=export checkpoint=RUN export.dir=serving/pets export.temperature=auto   # fitted on val
    python run.py mode=export checkpoint=RUN export.dir=serving/pets export.temperature=1.7

The evaluation report gives the temperature that minimises the validation NLL
(`trainer.evaluation.calibration`); `with_temperature` wraps the inference model so that
every exported format returns the scaled probabilities. The wrapper is built where it is
used and never saved as a checkpoint.
"""

from __future__ import annotations

import keras
from keras import ops

EPSILON = 1e-12


def with_temperature(model: keras.Model, temperature: float | None) -> keras.Model:
    """`model` itself for None or 1; else a model returning softmax(log(model(x)) / temperature)."""
    if temperature is None or temperature == 1.0:
        return model
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0. Received: temperature={temperature}")
    image = keras.Input(shape=model.input_shape[1:], dtype=model.inputs[0].dtype, name="image")
    probabilities = ops.cast(model(image), "float32")
    scaled = ops.softmax(ops.log(ops.maximum(probabilities, EPSILON)) / float(temperature), axis=-1)
    return keras.Model(image, scaled, name=model.name)
