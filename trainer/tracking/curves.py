"""curves.png: loss, accuracy and learning rate per epoch, train and validation, the best epoch starred.

    python run.py          # RUN/curves.png, redrawn as epochs end and once more at the end

Drawn from history.csv (`trainer.runs.history`) by a Keras callback in a background
thread, with matplotlib's object API (no pyplot), so drawing never blocks training for long.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import keras

from trainer.runs import history
from trainer.runs.atomic import write_atomic

log = logging.getLogger(__name__)


def draw_curves(
    rows: list[dict[str, str]],
    path: str | os.PathLike,
    title: str = "",
    monitor: str = "val_accuracy",
    mode: str = "max",
    tolerance: float = 0.0,
) -> Path | None:
    """Loss (log scale), accuracy and learning rate per epoch, train and validation, with the best epoch by
    `monitor` marked; None before the first epoch. No pyplot, so it is safe outside the main thread.

    Epochs are numbered from 1 by row, whatever history.csv's own epoch column counts from.
    """
    if not rows:
        return None
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    epochs = list(range(1, len(rows) + 1))
    columns = history.columns(rows)
    panels = [("loss", ("loss", "val_loss")), ("accuracy", ("accuracy", "val_accuracy"))]
    if "learning_rate" in columns:
        panels.append(("learning rate", ("learning_rate",)))
    best = history.best_index(columns[monitor], mode, tolerance) if monitor in columns else None
    figure = Figure(figsize=(5 * len(panels), 4), dpi=100)
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (label, names) in zip(axes, panels, strict=True):
        for name in names:
            values = columns.get(name)
            if values is None:
                continue
            style = "--s" if name.startswith("val_") else "-o"
            axis.plot(epochs, values, style, label=name, markersize=3)
            if best is not None and name == monitor:
                axis.plot(epochs[best], values[best], "*", color="crimson", markersize=14, label=f"best: {monitor}")
        if label == "loss":
            shown = [value for name in names for value in columns.get(name, [])]
            if shown and min(shown) > 0:
                axis.set_yscale("log")  # a first-epoch val_loss in the thousands would flatten the rest
        if best is not None:
            axis.axvline(epochs[best], color="crimson", alpha=0.3, linestyle=":")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_xlabel("epoch")
        axis.set_title(label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
    best_text = f", best epoch {epochs[best]} by {monitor}" if best is not None else ""
    figure.suptitle(f"{title}{best_text}" if title else best_text.lstrip(", "))
    figure.tight_layout()
    write_atomic(path, lambda temporary: figure.savefig(temporary, format="png"))
    return Path(path)


_DRAWINGS: list[threading.Thread] = []  # the drawings of the runs of this process, until `wait_for_drawings`


def wait_for_drawings() -> None:
    """Waits for the curves.png drawings handed to the background: call before saying that curves.png is
    there, and before a hard exit (a drawing cut short leaves its temporary file). They are non-daemon
    threads, so a process that ends normally ends them too."""
    while _DRAWINGS:
        _DRAWINGS.pop().join()


class Curves(keras.callbacks.Callback):
    """Redraws curves.png from history.csv after epochs, in a background thread, and once more when training
    ends with every epoch, in the background too (`wait_for_drawings` joins it).

    A drawing holds Python's lock for about a second (matplotlib's layout and PNG writer), time the training
    loop waits for. So the thread draws again only when at least `DRAW_SHARE` of the time since the last
    drawing ended would have gone into drawing: every epoch of a run whose epochs take a minute, every third
    or so of the digits demo's 6-second epochs. The last drawing never holds up the end of `fit`: joined there,
    a drawing that a busy machine had slowed (the first one loads the fonts) kept the test evaluation waiting
    for 5 to 12 s in 4 of 20 demo runs.
    """

    DRAW_SHARE = 20  # the wall time between drawings, in drawing times: at most ~5% of the training time

    def __init__(
        self, history_csv: Path, path: Path, title: str = "", monitor: str = "val_accuracy", mode="max", tolerance=0.0
    ):
        super().__init__()
        self.history_csv, self.path = history_csv, path
        self.title, self.monitor, self.mode, self.tolerance = title, monitor, mode, tolerance
        self.drawing: threading.Thread | None = None
        self.drawn_epochs = 0  # rows handed to the last drawing
        self.next_drawing = 0.0  # time.monotonic() from which the next drawing may start

    def on_epoch_end(self, epoch, logs=None):
        if (self.drawing is not None and self.drawing.is_alive()) or time.monotonic() < self.next_drawing:
            return  # the next epoch end (or the train end) catches up
        rows = history.read_rows(self.history_csv)  # here, not in the thread: the next epoch rewrites the file
        self.drawn_epochs = len(rows)
        self.drawing = threading.Thread(target=self._draw_in_turn, args=(rows,), name="curves")
        self.drawing.start()
        _DRAWINGS[:] = [*(drawing for drawing in _DRAWINGS if drawing.is_alive()), self.drawing]

    def _draw_in_turn(self, rows: list[dict]) -> None:
        started = time.monotonic()
        self._draw(rows)
        ended = time.monotonic()
        self.next_drawing = ended + self.DRAW_SHARE * (ended - started)

    def on_train_end(self, logs=None):
        rows = history.read_rows(self.history_csv)
        if len(rows) == self.drawn_epochs:
            if self.drawing is not None:
                _DRAWINGS.append(self.drawing)
            return
        earlier = self.drawing

        def catch_up() -> None:  # after the drawing in progress, with every epoch
            if earlier is not None:
                earlier.join()
            self._draw(rows)

        self.drawn_epochs = len(rows)
        self.drawing = threading.Thread(target=catch_up, name="curves-final")
        self.drawing.start()
        _DRAWINGS.append(self.drawing)

    def _draw(self, rows: list[dict]) -> None:
        try:
            draw_curves(rows, self.path, self.title, self.monitor, self.mode, self.tolerance)
        except Exception as error:  # a plot must never stop training
            log.warning("could not draw %s: %s", self.path, error)
