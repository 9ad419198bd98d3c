"""Data: record files on disk (binary, TFRecord), sources, batch decoders, the one input pipeline, the host's
preprocessing, the augmentation config, worker shares, prediction inputs and the converter.

    python -m trainer.convert PetImages/ records/       # image folders to TFRecords
"""
