"""The one augmentation config, `dataset.augment`: what the host does to stored pixels, and what the model does.

    python run.py dataset=cifar dataset.augment.crop=pad dataset.augment.flip=true
    python run.py mode=inspect inspect.augmented=true      # both parts, as the network sees them

The host view (`crop`, `crop_size`, `padding`, `min_area`) cuts windows out of the
stored bytes in the input pipeline (`trainer.data.preprocess`): crops set the input size
and are cheapest on uint8. The model view (`flip`, `brightness`, `contrast_*`) becomes
Keras's random layers in the training wrapper around the saved model
(`trainer.models.preprocessing`), run on the accelerator and never saved. No TensorFlow
here: Hydra reads this schema before TensorFlow starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from trainer.errors import ConfigError


class Crop(str, Enum):
    """`dataset.augment.crop`; compares and prints as its plain string."""

    random = "random"  # a crop_size window at a random offset (the centre at evaluation)
    pad = "pad"  # pad by `padding` on each side, then crop back to the image size at a random offset
    random_resized = "random_resized"  # Inception-style: random area and aspect ratio, resized back
    none = "none"

    __str__ = str.__str__
    __format__ = str.__format__


def _require(condition: bool, key: str, expected: str, value) -> None:
    if not condition:
        raise ConfigError(f"dataset.augment.{key} must be {expected}; got {value!r}")


@dataclass
class Augmentation:
    """Training augmentation, every parameter drawn per image; evaluation uses none of it."""

    # The host's part: crops of the stored uint8 pixels.
    crop: Crop = Crop.none  # random | pad | random_resized | none
    crop_size: int = 0  # random: output size of the crop (0 = image_size)
    padding: int = 4  # pad: pixels added on each side before the random crop
    min_area: float = 0.25  # random_resized: smallest crop as a fraction of the image area
    # The model's part: Keras's random layers in the training wrapper, on the 0..255 scale.
    flip: bool = False  # random horizontal flip
    brightness: float = 0.0  # max brightness delta; 0 disables
    contrast_lower: float = 1.0  # contrast factor range; 1.0..1.0 disables
    contrast_upper: float = 1.0  # upper end of the contrast factor range

    def __post_init__(self) -> None:
        _require(0 < self.min_area <= 1, "min_area", "in (0, 1]", self.min_area)
        _require(self.crop_size >= 0, "crop_size", ">= 0", self.crop_size)
        _require(self.padding >= 0, "padding", ">= 0", self.padding)
        _require(self.brightness >= 0, "brightness", ">= 0", self.brightness)
        _require(
            0 < self.contrast_lower <= self.contrast_upper,
            "contrast_lower",
            "> 0 and <= contrast_upper",
            self.contrast_lower,
        )

    def output_size(self, image_size: int) -> int:
        """Side of the square image the model sees when the host crops images of `image_size`."""
        return self.crop_size if self.crop == "random" and self.crop_size else image_size

    def check_fits(self, image_size: int) -> None:
        """A random crop must fit in the (resized) image it is cut from."""
        if self.crop == "random" and self.crop_size:
            _require(
                self.crop_size <= image_size,
                "crop_size",
                f"<= the {image_size}-pixel image it is cut from (dataset.image_size)",
                self.crop_size,
            )

    @property
    def in_model(self) -> bool:
        """Whether the model's part changes anything (else the training wrapper adds no layer)."""
        return self.flip or bool(self.brightness) or (self.contrast_lower, self.contrast_upper) != (1.0, 1.0)
