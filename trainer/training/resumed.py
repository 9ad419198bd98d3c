"""Going on within an epoch: a run stopped some steps into an epoch (SIGTERM, Ctrl-C, `trainer.save_every_steps`)
and resumed trains only that epoch's remaining steps, numbered as in the run never stopped.

    python run.py resume=RUN      # "Epoch 3 goes on at step 15 of 40, where its backup was made ..."

Keras's `fit` runs whole epochs of `steps_per_epoch` steps. `WithinEpoch`, the callback list given
to `fit`, passes over the first steps of the resumed epoch: no batch is read for them (the caller
starts the input after them), no update is made, and no callback hears of them. The optimizer's
iterations come from the backup, so the learning-rate schedule is where it was; the backup puts
the epoch's running means back (`trainer.runs.backup.RunBackup`).
"""

from __future__ import annotations

import keras


def going_on(epoch: int, passed: int, steps: int, epochs: int | None = None) -> str:
    """Where a resume goes on in `epoch` (0-based) when the backup holds `passed` of its `steps` steps, as the
    stop's line and the resume's line both say it: a backup made after an epoch's last step leaves only the
    epoch's end (validation, checkpoints, its history.csv row), no step; one made after the last of `epochs`
    leaves only the test evaluation."""
    if passed <= 0 and epochs is not None and epoch >= epochs:
        return "every epoch is done, only the test evaluation is left"
    if passed <= 0:
        return f"epoch {epoch + 1} starts at its first step"
    if passed >= steps:
        return f"epoch {epoch + 1} goes on after its last step ({steps} of {steps}), with only its end left"
    return f"epoch {epoch + 1} goes on at step {passed + 1} of {steps}"


class WithinEpoch(keras.callbacks.CallbackList):
    """`fit`'s callbacks (a History added, as `fit` would) for a run resumed `passed` steps into `epoch`
    (0-based): those steps of that epoch are passed over, every later step keeps its number in the epoch.

    `params` are what `fit` would give the callbacks (`verbose`, `epochs`, `steps`).
    """

    def __init__(
        self, callbacks: list[keras.callbacks.Callback], model: keras.Model, epoch: int, passed: int, **params
    ):
        super().__init__(callbacks, add_history=True, model=model, **params)
        self.epoch, self.passed = epoch, passed
        self.current, self.step, self.train_function = -1, 0, None

    def _passing(self) -> bool:
        return self.current == self.epoch and self.step < self.passed

    def _train_function(self, iterator):
        if self._passing():
            return self.model.get_metrics_result()  # the backup's means: the epoch's logs if no step is left
        return self.train_function(iterator)

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch
        if epoch == self.epoch and self.passed:
            self.train_function, self.model.train_function = self.model.train_function, self._train_function
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_begin(self, batch, logs=None):
        self.step = batch
        if not self._passing():
            super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
        if self.current != self.epoch or batch >= self.passed:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        self._unwrap()
        super().on_epoch_end(epoch, logs)

    def on_train_end(self, logs=None):
        self._unwrap()
        super().on_train_end(logs)

    def _unwrap(self) -> None:
        if self.train_function is not None:
            self.model.train_function, self.train_function = self.train_function, None
