"""Learning-rate schedules: the rate of every step as a pure function of where training is.

    schedule = Schedule(config.optimizer, steps_per_epoch=469, epochs=20)
    updater.lr = schedule.rate(epoch, step)          # before each step (epoch and step from 0)
    schedule.end_epoch(metrics)                      # reduce_on_plateau: the epoch's evaluation (the same everywhere)
    schedule.state(); schedule.load_state(saved)     # what a checkpoint keeps: the plateau's counters

A schedule counts `t` in its `unit`, epochs (the default, as Lightning's `interval: epoch` and a PyTorch scheduler
stepped once per epoch) or steps (once per step, as Hugging Face's schedules). With `warmup: W`, the first W units
run at lr (t + 1) / W, rising to lr, and the schedule proper then starts from its own t' = t - W over the T' = T - W
units left (T: the run's epochs, or its steps): PyTorch's `SequentialLR` of `LinearLR(1 / W, 1, W - 1)` and the
schedule. The schedules, at t' of T' (lr: `optimizer.lr`):

| type | rate | PyTorch |
| --- | --- | --- |
| `constant` | lr | (no scheduler) |
| `step` | lr gamma^(milestones passed: those <= t') | `MultiStepLR(milestones, gamma)` |
| `exponential` | lr gamma^t' | `ExponentialLR(gamma)` |
| `cosine` | min_lr + (lr - min_lr) (1 + cos(pi t' / T')) / 2 | `CosineAnnealingLR(T', min_lr)` |
| `linear` | lr + (min_lr - lr) t' / T' | `LinearLR(1, min_lr / lr, T')` |
| `polynomial` | min_lr + (lr - min_lr) (1 - t' / T')^power | `PolynomialLR(T', power)` (min_lr 0) |
| `onecycle` | lr / div_factor up to lr over pct_start of T', then down to lr / div_factor / final_div_factor, each half a cosine (no warm-up of its own: it is one) | `OneCycleLR(lr, T', pct_start, 'cos', div_factor, final_div_factor)`, momentum not cycled |
| `reduce_on_plateau` | lr factor^k, at least min_lr, k the reductions so far: one each time `monitor` of the epoch's evaluation has not improved by `threshold` (relative) for more than `patience` epochs, then `cooldown` epochs without counting | `ReduceLROnPlateau(mode, factor, patience, threshold, 'rel', cooldown, min_lr)` |

The rate depends on (epoch, step, the steps per epoch) and the plateau's counters alone, which a checkpoint keeps:
a resumed run takes the same rates as one that never stopped. `optimizer.lr_decay` (lr lr_decay^epoch) is the
`exponential` schedule by epoch, kept as it was; a config sets one or the other.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from mpitrain.base.errors import ConfigError
from mpitrain.base.options import ALLOWED, Options, check_value, option

UNITS = ("epoch", "step")
SCHEDULES = ("constant", "step", "exponential", "cosine", "linear", "polynomial", "onecycle", "reduce_on_plateau")
MAX_WARMUP = 10**9


@dataclass(frozen=True)
class ScheduleOptions(Options):
    """`optimizer.schedule`: how the learning rate moves during training (see the module docstring)."""

    ON_RESUME = ALLOWED

    type: str = option("constant", "The schedule: constant, step (milestones, gamma), exponential (gamma), cosine "
                                   "(to min_lr), linear (to min_lr), polynomial (power, to min_lr), onecycle "
                                   "(pct_start, div_factor, final_div_factor) or reduce_on_plateau (monitor, factor, "
                                   "patience, cooldown, threshold, min_lr). See docs/recipes.md.", SCHEDULES)
    unit: str = option("epoch", "What the schedule's t counts: epoch (the rate changes as each epoch starts) or "
                                "step (at every step); also the unit of warmup and milestones.", UNITS)
    warmup: int = option(0, "Linear warm-up: the first `warmup` units run at lr (t + 1) / warmup; the schedule "
                            "starts after them. 0: none.", domain=f"[0, {MAX_WARMUP}]")
    milestones: list = option([], "step: the t (counted from the warm-up's end) at which the rate is multiplied by "
                                  "gamma, increasing.")
    gamma: float = option(0.1, "step and exponential: the factor per milestone, or per unit.", domain="(0, 1]")
    min_lr: float = option(0.0, "cosine, linear, polynomial: the rate at the end; reduce_on_plateau: the lowest "
                                "rate.", domain="[0, 1000]")
    power: float = option(1.0, "polynomial: the power of (1 - t / T).", domain="(0, 100]")
    pct_start: float = option(0.3, "onecycle: the share of the run spent rising to lr.", domain="(0, 1)")
    div_factor: float = option(25.0, "onecycle: the rate starts at lr / div_factor.", domain="[1, 1e9]")
    final_div_factor: float = option(1.0e4, "onecycle: it ends at lr / div_factor / final_div_factor.",
                                     domain="[1, 1e12]")
    monitor: str = option("loss", "reduce_on_plateau: the metric of the evaluation after each epoch (data.test_split"
                                  "'s: loss, accuracy, auc, f1, r2, rmse, ...); lower is better for loss, mse, rmse "
                                  "and mae, higher for the others.")
    factor: float = option(0.1, "reduce_on_plateau: the rate's factor at each reduction.", domain="(0, 1)")
    patience: int = option(10, "reduce_on_plateau: epochs without improvement before a reduction.",
                           domain="[0, 1e6]")
    cooldown: int = option(0, "reduce_on_plateau: epochs after a reduction before counting again.",
                           domain="[0, 1e6]")
    threshold: float = option(1.0e-4, "reduce_on_plateau: the relative improvement that counts as one.",
                              domain="[0, 1)")

    def validate(self, where, prefix):
        self.check_domains(where, prefix)
        milestones = self.milestones
        check_value(isinstance(milestones, list) and all(isinstance(m, int) and not isinstance(m, bool) and m > 0
                                                          for m in milestones)
                    and milestones == sorted(set(milestones)), where, f"{prefix}milestones", milestones,
                    "a list of increasing positive integers")
        check_value(self.type != "step" or milestones, where, f"{prefix}milestones", milestones,
                    "at least one milestone for the step schedule")
        check_value(not (self.warmup and self.type == "onecycle"), where, f"{prefix}warmup", self.warmup,
                    "0 with onecycle (its rising part is its warm-up)")
        check_value(self.type != "reduce_on_plateau" or self.unit == "epoch", where, f"{prefix}unit", self.unit,
                    "epoch with reduce_on_plateau (it decides after each epoch's evaluation)")
        return self


# Lower is better for these metrics of an evaluation; higher for every other.
LOWER_IS_BETTER = ("loss", "mse", "rmse", "mae")


def monitored(metrics: dict, monitor: str, key: str) -> tuple[float, bool]:
    """(the value of metric `monitor` among an evaluation's `metrics`, whether lower is better); a ConfigError naming
    the config `key` that asked for it and the numbers the evaluation has, when it has no such number. Reduce on
    plateau and early stopping both watch a metric so."""
    value = metrics.get(monitor)
    if value is None:
        numbers = sorted(k for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
        raise ConfigError(f"{key} is {monitor!r}, but the evaluation has no such number; expected one of {numbers}")
    return float(value), monitor in LOWER_IS_BETTER


class Schedule:
    """The learning rate of a run of `epochs` epochs of `steps_per_epoch` steps under `optimizer` (an
    OptimizerConfig: `lr`, `lr_decay` and its `schedule`). Nothing here is a collective: every rank computes the same
    rates from the same numbers."""

    def __init__(self, optimizer, steps_per_epoch: int, epochs: int):
        self.lr, self.lr_decay, self.options = optimizer.lr, optimizer.lr_decay, optimizer.schedule
        self.steps_per_epoch = steps_per_epoch
        total = epochs if self.options.unit == "epoch" else epochs * steps_per_epoch
        self.span = total - self.options.warmup  # T': the units after the warm-up
        if self.span < 1 and self.options.type != "constant" or self.span < 0:
            raise ConfigError(f"optimizer.schedule.warmup is {self.options.warmup} {self.options.unit}s, but the run "
                              f"has {total} ({epochs} epochs of {steps_per_epoch} steps); expected fewer")
        self.reductions, self.best, self.bad_epochs, self.cooling = 0, None, 0, 0

    def rate(self, epoch: int, step: int) -> float:
        """The learning rate of step `step` of epoch `epoch`."""
        o = self.options
        t = epoch if o.unit == "epoch" else epoch * self.steps_per_epoch + step
        if t < o.warmup:
            return self.lr * (t + 1) / o.warmup
        t -= o.warmup
        if o.type == "constant":
            return self.lr * self.lr_decay ** epoch  # lr_decay: 1 unless set (then bit for bit as it always ran)
        if o.type == "step":
            return self.lr * o.gamma ** bisect.bisect_right(o.milestones, t)
        if o.type == "exponential":
            return self.lr * o.gamma ** t
        if o.type == "cosine":
            return o.min_lr + (self.lr - o.min_lr) * (1 + math.cos(math.pi * t / self.span)) / 2
        if o.type == "linear":
            return self.lr + (o.min_lr - self.lr) * min(t, self.span) / self.span
        if o.type == "polynomial":
            return o.min_lr + (self.lr - o.min_lr) * (1 - min(t, self.span) / self.span) ** o.power
        if o.type == "onecycle":
            return self._one_cycle(t)
        return max(self.lr * o.factor ** self.reductions, o.min_lr) if self.reductions else self.lr

    def _one_cycle(self, t: int) -> float:
        """PyTorch's OneCycleLR (two phases, cosine annealing) at step t of `span`."""
        o = self.options
        low = self.lr / o.div_factor
        rise = o.pct_start * self.span - 1
        if t <= rise:
            start, end, progress = low, self.lr, t / rise if rise > 0 else 1.0
        else:
            start, end, progress = self.lr, low / o.final_div_factor, (t - rise) / (self.span - 1 - rise)
        return end + (start - end) / 2 * (math.cos(math.pi * progress) + 1)

    def end_epoch(self, metrics: dict) -> None:
        """After an epoch's evaluation (`metrics`: its numbers by name, the same on every rank): reduce_on_plateau
        counts the epoch, and reduces the rate once it has waited `patience` epochs without improvement (PyTorch's
        ReduceLROnPlateau, relative threshold). Nothing for the other schedules."""
        o = self.options
        if o.type != "reduce_on_plateau":
            return
        value, lower = monitored(metrics, o.monitor, "optimizer.schedule.monitor")
        better = self.best is None or (value < self.best * (1 - o.threshold) if lower
                                       else value > self.best * (1 + o.threshold))
        if better:
            self.best, self.bad_epochs = value, 0
        else:
            self.bad_epochs += 1
        if self.cooling:
            self.cooling -= 1
            self.bad_epochs = 0
        if self.bad_epochs > o.patience:
            if self.lr * o.factor ** self.reductions > o.min_lr:  # at min_lr already: nothing to reduce
                self.reductions += 1
            self.cooling, self.bad_epochs = o.cooldown, 0

    def state(self) -> dict:
        """What a checkpoint keeps to resume the rates exactly: the plateau's counters (numbers, the same on every
        rank)."""
        return {"reductions": self.reductions, "best": self.best, "bad_epochs": self.bad_epochs,
                "cooling": self.cooling}

    def load_state(self, saved: dict) -> None:
        """Take back `state()` from a checkpoint (an older checkpoint's empty one leaves a fresh start)."""
        self.reductions = int(saved.get("reductions", 0))
        self.best = None if saved.get("best") is None else float(saved["best"])
        self.bad_epochs, self.cooling = int(saved.get("bad_epochs", 0)), int(saved.get("cooling", 0))
