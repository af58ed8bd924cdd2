"""Early stopping (`train.early_stopping`), as DL4J's EarlyStoppingTrainer and Keras's and Lightning's callbacks:
training ends once the monitored metric has not improved for `patience` evaluations, and the best model is kept.

    stopping = EarlyStopping(config.train.early_stopping)
    if stopping.due(epoch, step, steps_per_epoch): ...       # an evaluation point (every `every` epochs or steps)
    improved = stopping.observe(metrics, epoch, step)        # the evaluation's numbers: the same on every rank
    stopping.stop                                            # patience ran out: every rank stops at this point

The evaluation is that of `data.test_split` (set it to `validation`, a split `mpitrain etl --validation-fraction`
carves, to keep the test split unseen). `loss`, `mse`, `rmse` and `mae` improve downwards, every other metric
upwards; an improvement must beat the best by more than `min_delta` (absolute, as Keras's and Lightning's). Every
rank sees the same numbers (an evaluation is allreduced), so every rank decides the same at the same step. The
counters go into every checkpoint (`state`), so a resumed run stops where one that never stopped would.
"""
from __future__ import annotations

from mpitrain.nn.schedules import monitored


class EarlyStopping:
    """The counters of early stopping under `options` (`train.early_stopping`, see the module docstring). Not a
    collective."""

    def __init__(self, options):
        self.options = options
        self.best, self.best_at, self.waited, self.stop, self.stopped_at = None, None, 0, False, None

    @property
    def on(self) -> bool:
        return bool(self.options.monitor)

    def due(self, epoch: int, step: int, steps_per_epoch: int, epoch_end: bool) -> bool:
        """Whether the point after step `step` (0-based) of `epoch` is an evaluation point: an epoch's end, every
        `every` epochs (unit epoch), or every `every` steps counted over the run (unit step)."""
        o = self.options
        if not self.on:
            return False
        if o.unit == "epoch":
            return epoch_end and (epoch + 1) % o.every == 0
        return (epoch * steps_per_epoch + step + 1) % o.every == 0

    def observe(self, metrics: dict, epoch: int, step: int) -> bool:
        """Count an evaluation (`metrics`: its numbers by name) of the model at the point where a checkpoint would
        resume at step `step` of epoch `epoch` (an epoch's end: (epoch + 1, 0)); whether it is the best so far.
        Sets `stop` once `patience` evaluations in a row have not improved."""
        o = self.options
        value, lower = monitored(metrics, o.monitor, "train.early_stopping.monitor")
        improved = self.best is None or (value < self.best - o.min_delta if lower else value > self.best + o.min_delta)
        if improved:
            self.best, self.best_at, self.waited = value, [epoch, step], 0
        else:
            self.waited += 1
            self.stop = self.waited >= o.patience
            self.stopped_at = [epoch, step] if self.stop else None
        return improved

    def state(self) -> dict:
        """What a checkpoint keeps: the best value and where it was, the evaluations waited, whether it stopped."""
        return {"best": self.best, "best_at": self.best_at, "waited": self.waited, "stopped": self.stop,
                "stopped_at": self.stopped_at}

    def load_state(self, saved: dict) -> None:
        """Take back `state()` (an older checkpoint's empty one leaves a fresh start)."""
        self.best = None if saved.get("best") is None else float(saved["best"])
        self.best_at = saved.get("best_at")
        self.waited, self.stop = int(saved.get("waited", 0)), bool(saved.get("stopped", False))
        self.stopped_at = saved.get("stopped_at")

    def summary(self) -> dict:
        """summary.json's account: the monitor, its best value and where, whether training stopped early and where
        (each place as [epochs done, steps of the next], a checkpoint's position)."""
        return {"monitor": self.options.monitor, "best": self.best, "best_at": self.best_at,
                "stopped_early": self.stop, "stopped_at": self.stopped_at}
