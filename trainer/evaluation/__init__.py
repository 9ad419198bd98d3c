"""Why a model is wrong: per-class figures, its worst mistakes with Grad-CAM, its calibration, in one report."""
