"""The config's own choices (the dataset formats' live beside them, in `trainer.data.formats`).

python run.py trainer.precision=float64   # -> refused when Hydra composes: expected one of [float32, ...]
"""

from __future__ import annotations

from trainer.distribute.cluster import CLUSTER_SOURCES
from trainer.fields import choice
from trainer.models import TTA

ScheduleName = choice("ScheduleName", "constant", "step", "cosine")
Precision = choice("Precision", "auto", "float32", "mixed_float16", "mixed_bfloat16")  # trainer.training.precision
Direction = choice("Direction", "max", "min")
EvaluateSplit = choice("EvaluateSplit", "val", "test")
Split = choice("Split", "train", "val", "test")
WandbMode = choice("WandbMode", "offline", "online", "disabled")
Mode = choice("Mode", "train", "evaluate", "predict", "inspect", "export")
ExportFormat = choice("ExportFormat", "saved_model", "onnx", "litert", "openvino", "all")
Quantize = choice("Quantize", "none", "float16", "int8")
TestTimeAugmentation = choice("TestTimeAugmentation", *TTA)  # trainer.models.tta
PredictFormat = choice("PredictFormat", "auto", "images", "binary", "tfrecord", "records")  # records: binary's old
# name, still read (trainer.data.predict_inputs.FORMAT_ALIASES; remove in vggtrain 0.2, docs/development.md row 13)
ClusterSource = choice("ClusterSource", *CLUSTER_SOURCES)  # trainer.distribute.cluster
# Integer options: a field holds the member while Hydra composes, and its number once `__post_init__` ran.
Verbosity = choice("Verbosity", "0", "1", "2")
# Checked by `chosen`, not typed: true and false are booleans to Hydra's override parser and to YAML, and OmegaConf
# refuses a boolean for an enum field before any hook of ours could read it as "true".
JitCompile = choice("JitCompile", "auto", "true", "false")
