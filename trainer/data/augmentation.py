"""The one augmentation config, `dataset.augment`: what the host does to stored pixels, and what the model does.

    python run.py dataset=cifar dataset.augment.crop=pad dataset.augment.flip=true
    python run.py dataset.augment.policy=randaugment dataset.augment.random_erasing=0.25
    python run.py dataset.augment.mixup_alpha=0.2 dataset.augment.cutmix_alpha=1.0
    python run.py mode=inspect inspect.augmented=true      # both parts, as the network sees them

The host view (`crop`, `crop_size`, `padding`, `min_area`) cuts windows out of the
stored bytes in the input pipeline (`trainer.data.preprocess`): crops set the input size
and are cheapest on uint8. MixUp and CutMix (`mixup_alpha`, `cutmix_alpha`, `mix_prob`,
`mix_switch_prob`) change the labels too, so they also run on the host, on whole batches
(`trainer.data.mixing`). The model view (`flip`, `brightness`, `contrast_*`, `policy`,
`random_erasing`) becomes Keras's random layers in the training wrapper around the saved
model (`trainer.models.preprocessing`), run on the accelerator and never saved. No
TensorFlow here: Hydra reads this schema before TensorFlow starts.
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


class Policy(str, Enum):
    """`dataset.augment.policy`: one of Keras's augmentation policies, in the training wrapper."""

    none = "none"
    randaugment = "randaugment"  # keras.layers.RandAugment: 2 random ops per image, strength policy_magnitude
    augmix = "augmix"  # keras.layers.AugMix: a mix of 3 augmentation chains, severity policy_magnitude

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
    policy: Policy = Policy.none  # none | randaugment | augmix
    policy_magnitude: float | None = None  # in (0, 1]; null: Keras's default (RandAugment 0.5, AugMix 0.3)
    random_erasing: float = 0.0  # probability of erasing a random rectangle of an image (keras RandomErasing)
    # The host's batch part: MixUp and CutMix, which mix the labels too (on whole batches, one-hot labels).
    mixup_alpha: float = 0.0  # MixUp: weight ~ Beta(alpha, alpha); 0 disables
    cutmix_alpha: float = 0.0  # CutMix: pasted area ~ Beta(alpha, alpha); 0 disables
    mix_prob: float = 1.0  # probability that an image is mixed at all (with MixUp or CutMix on)
    mix_switch_prob: float = 0.5  # with both on: probability that an image gets CutMix rather than MixUp

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
        try:
            self.policy = Policy(str(self.policy))
        except ValueError:
            _require(False, "policy", "none, randaugment or augmix", self.policy)
        magnitude = self.policy_magnitude
        _require(magnitude is None or 0 < magnitude <= 1, "policy_magnitude", "in (0, 1] or null", magnitude)
        _require(0 <= self.random_erasing <= 1, "random_erasing", "a probability in [0, 1]", self.random_erasing)
        _require(self.mixup_alpha >= 0, "mixup_alpha", ">= 0 (0: off)", self.mixup_alpha)
        _require(self.cutmix_alpha >= 0, "cutmix_alpha", ">= 0 (0: off)", self.cutmix_alpha)
        _require(0 <= self.mix_prob <= 1, "mix_prob", "a probability in [0, 1]", self.mix_prob)
        _require(0 <= self.mix_switch_prob <= 1, "mix_switch_prob", "a probability in [0, 1]", self.mix_switch_prob)

    def output_size(self, image_size: int) -> int:
        """Side of the square image the model sees when the host crops images of `image_size`."""
        return self.crop_size if self.crop == "random" and self.crop_size else image_size

    def check_fits(self, image_size: int) -> None:
        """A random crop must fit in the (resized) image it is cut from, and keep at least half of its side:
        `dataset.image_size=64` on CIFAR (crop_size 28) would train a 28x28 model on 64x64 images' corners."""
        if self.crop == "random" and self.crop_size:
            _require(
                self.crop_size <= image_size,
                "crop_size",
                f"<= the {image_size}-pixel image it is cut from (dataset.image_size)",
                self.crop_size,
            )
            _require(
                2 * self.crop_size >= image_size,
                "crop_size",
                f"at least half of the {image_size}-pixel image it is cut from (dataset.image_size={image_size}): "
                f"the model sees crop_size x crop_size; set both, e.g. dataset.augment.crop_size="
                f"{round(image_size * 0.875)}, or dataset.augment.crop=none",
                self.crop_size,
            )

    @property
    def mixing(self) -> bool:
        """Whether MixUp or CutMix mixes training batches (then the labels are one-hot and soft, the images
        float32)."""
        return bool(self.mixup_alpha or self.cutmix_alpha) and self.mix_prob > 0
