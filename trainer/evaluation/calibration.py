"""Whether a model's probabilities can be trusted: expected calibration error, the reliability diagram, and
the temperature that makes them honest.

    python run.py mode=evaluate checkpoint=RUN     # report/calibration.png; ECE before and after scaling

The temperature `T` divides the log-probabilities before the softmax (Guo et al., 2017, "On
Calibration of Modern Neural Networks"); it is the one that minimises the negative
log-likelihood of the validation split, and the report gives the test split's ECE with it.
It is fitted only on evidence: `MIN_EXAMPLES` images with `MIN_MISTAKES` mistakes among them
(on a split without a mistake the NLL falls forever as T shrinks), and held within `TEMPERATURES`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainer.runs.atomic import write_atomic

BINS = 15  # equal-width confidence bins, as in Guo et al.
TEMPERATURES = (0.25, 4.0)  # the bounds of T: 4 makes a 0.99 of two classes 0.76; 0.25 makes a 0.6 one 0.84
MIN_EXAMPLES = 10  # fewer validation images fit no temperature (2 of them fitted T=19.9)
MIN_MISTAKES = 3  # nor do fewer mistakes among them (none fitted T=0.05: logits times 20)
EPSILON = 1e-12


@dataclass(frozen=True)
class Reliability:
    """Per confidence bin: the mean confidence, the accuracy and the number of examples."""

    edges: np.ndarray  # [bins + 1]
    confidence: np.ndarray  # [bins], NaN where a bin is empty
    accuracy: np.ndarray  # [bins], NaN where a bin is empty
    counts: np.ndarray  # [bins]

    @property
    def ece(self) -> float:
        """Expected calibration error: the count-weighted mean gap between confidence and accuracy."""
        filled = self.counts > 0
        gaps = np.abs(self.confidence[filled] - self.accuracy[filled])
        return float(np.sum(gaps * self.counts[filled]) / max(1, self.counts.sum()))


def reliability(probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS) -> Reliability:
    """The reliability of the top prediction over `bins` equal-width bins of confidence in (0, 1]."""
    confidence = probabilities.max(axis=1)
    right = (probabilities.argmax(axis=1) == labels).astype(np.float64)
    edges = np.linspace(0.0, 1.0, bins + 1)
    slot = np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)  # (lo, hi]: hi's bin
    counts = np.bincount(slot, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_confidence = np.bincount(slot, confidence, bins) / counts
        accuracy = np.bincount(slot, right, bins) / counts
    return Reliability(edges, mean_confidence, accuracy, counts)


def scale(probabilities: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(log(p) / T): the probabilities at temperature `T` (1 leaves them as they are)."""
    logits = np.log(np.maximum(probabilities.astype(np.float64), EPSILON)) / temperature
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)


def nll(probabilities: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
    """The mean negative log-likelihood of the labels at temperature `T`."""
    scaled = scale(probabilities, temperature) if temperature != 1.0 else probabilities
    picked = scaled[np.arange(len(labels)), labels]
    return float(-np.mean(np.log(np.maximum(picked, EPSILON))))


def fit_temperature(probabilities: np.ndarray, labels: np.ndarray, steps: int = 60) -> float:
    """The temperature in `TEMPERATURES` that minimises the NLL: a golden-section search over log T (the NLL
    is convex in 1/T, so unimodal in log T)."""
    low, high = np.log(TEMPERATURES[0]), np.log(TEMPERATURES[1])
    ratio = (np.sqrt(5) - 1) / 2
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = nll(probabilities, labels, np.exp(a)), nll(probabilities, labels, np.exp(b))
    for _ in range(steps):
        if fa <= fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = nll(probabilities, labels, np.exp(a))
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = nll(probabilities, labels, np.exp(b))
    return float(np.exp((low + high) / 2))


@dataclass(frozen=True)
class TemperatureFit:
    """A temperature fitted on a split, or why none was."""

    temperature: float | None  # None: too little evidence (`unfitted` says why)
    examples: int
    mistakes: int
    bound: float | None = None  # the bound of `TEMPERATURES` the NLL still fell past, where T is held

    @property
    def unfitted(self) -> str:
        """Why no temperature was fitted ("" when one was)."""
        if self.temperature is not None:
            return ""
        return (
            f"{self.examples} images with {self.mistakes} mistakes are too little evidence to fit a temperature on "
            f"(it needs {MIN_EXAMPLES} images and {MIN_MISTAKES} mistakes)"
        )

    @property
    def at_bound(self) -> str:
        """The line that says T is held at a bound ("" when it is not)."""
        if self.bound is None:
            return ""
        return (
            f"the NLL still falls past T={self.bound:g}, the bound of {TEMPERATURES[0]:g}-{TEMPERATURES[1]:g}: "
            f"T is held at {self.bound:g}"
        )


def fit_checked(probabilities: np.ndarray, labels: np.ndarray) -> TemperatureFit:
    """`fit_temperature` where the split holds enough evidence (`MIN_EXAMPLES`, `MIN_MISTAKES`); the fit says
    when it is held at a bound of `TEMPERATURES`."""
    examples = len(labels)
    mistakes = int(np.sum(probabilities.argmax(axis=1) != labels)) if examples else 0
    if examples < MIN_EXAMPLES or mistakes < MIN_MISTAKES:
        return TemperatureFit(None, examples, mistakes)
    fitted = fit_temperature(probabilities, labels)
    bound = None
    for edge, inward in ((TEMPERATURES[0], 1.01), (TEMPERATURES[1], 1 / 1.01)):
        if abs(np.log(fitted / edge)) < 1e-2 and nll(probabilities, labels, edge) <= nll(
            probabilities, labels, edge * inward
        ):
            fitted, bound = edge, edge
    return TemperatureFit(fitted, examples, mistakes, bound)


def plot_reliability(path: str | os.PathLike, before: Reliability, after: Reliability | None, title: str) -> Path:
    """The reliability diagram: accuracy against confidence per bin, the diagonal a perfect model's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(5, 5), dpi=100)
    centres = (before.edges[:-1] + before.edges[1:]) / 2
    width = before.edges[1] - before.edges[0]
    axes.bar(centres, np.nan_to_num(before.accuracy), width=width * 0.9, alpha=0.7, label=f"ECE {before.ece:.4f}")
    if after is not None:
        axes.plot(centres, after.accuracy, "o-", color="tab:orange", label=f"scaled: ECE {after.ece:.4f}")
    axes.plot([0, 1], [0, 1], "--", color="gray", label="perfectly calibrated")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.set_xlabel("confidence (top probability)")
    axes.set_ylabel("accuracy")
    axes.set_title(title)
    axes.legend(loc="upper left")
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png"))
    plt.close(figure)
    return Path(path)
