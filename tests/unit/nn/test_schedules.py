"""Learning-rate schedules (mpitrain/nn/schedules.py): every type's rate against its closed form and against
torch.optim.lr_scheduler stepped as a PyTorch user steps it, warm-up included; reduce_on_plateau against PyTorch's
on the same metrics; the counters a checkpoint keeps; the config's refusals."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import OptimizerConfig
from mpitrain.nn.schedules import Schedule, ScheduleOptions
from mpitrain.nn.updaters import create_updater

LR = 0.1


def optimizer(**schedule) -> OptimizerConfig:
    return OptimizerConfig(lr=LR, schedule=ScheduleOptions(**schedule)).validate("test")


def rates(schedule: Schedule, epochs: int, steps: int, unit: str) -> list[float]:
    """The rate of every unit of the run: each epoch's first step (unit epoch) or every step."""
    if unit == "epoch":
        return [schedule.rate(epoch, 0) for epoch in range(epochs)]
    return [schedule.rate(epoch, step) for epoch in range(epochs) for step in range(steps)]


def torch_rates(make, units: int, warmup: int = 0) -> list[float]:
    """What `make(optimizer)`'s scheduler gives at each of `units` steps of scheduler.step() (after a linear warm-up
    of `warmup` units, as torchvision's recipes chain them with SequentialLR)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    main = make(opt)
    if warmup:
        ramp = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1)
        main = torch.optim.lr_scheduler.SequentialLR(opt, [ramp, make(opt)], milestones=[warmup])
    seen = []
    for _ in range(units):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        main.step()
    return seen


S = torch.optim.lr_scheduler
# (schedule options, epochs, steps per epoch, PyTorch's scheduler for the units after the warm-up, T' -> scheduler)
CASES = {
    "step by epoch": ({"type": "step", "milestones": [3, 7], "gamma": 0.5}, 10, 4,
                      lambda span: lambda opt: S.MultiStepLR(opt, [3, 7], 0.5)),
    "exponential by epoch": ({"type": "exponential", "gamma": 0.8}, 8, 4, lambda span: lambda opt: S.ExponentialLR(opt, 0.8)),
    "cosine by epoch with warm-up": ({"type": "cosine", "min_lr": 0.001, "warmup": 3}, 12, 5,
                                     lambda span: lambda opt: S.CosineAnnealingLR(opt, span, 0.001)),
    "cosine by step": ({"type": "cosine", "unit": "step"}, 3, 17, lambda span: lambda opt: S.CosineAnnealingLR(opt, span)),
    "linear by step with warm-up": ({"type": "linear", "unit": "step", "min_lr": 0.002, "warmup": 10}, 4, 12,
                                    lambda span: lambda opt: S.LinearLR(opt, 1.0, 0.002 / LR, span)),
    "polynomial by step": ({"type": "polynomial", "unit": "step", "power": 2.0}, 2, 25,
                           lambda span: lambda opt: S.PolynomialLR(opt, span, 2.0)),
    "onecycle by step": ({"type": "onecycle", "unit": "step", "pct_start": 0.25}, 3, 20,
                         lambda span: lambda opt: S.OneCycleLR(opt, LR, total_steps=span, pct_start=0.25,
                                                               cycle_momentum=False)),
    "constant with warm-up by step": ({"type": "constant", "unit": "step", "warmup": 7}, 2, 10,
                                      lambda span: lambda opt: S.ConstantLR(opt, 1.0, 1)),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_every_schedule_gives_pytorchs_rates_unit_by_unit(case):
    options, epochs, steps, scheduler = CASES[case]
    config = optimizer(**options)
    unit, warmup = config.schedule.unit, config.schedule.warmup
    units = epochs if unit == "epoch" else epochs * steps
    ours = rates(Schedule(config, steps, epochs), epochs, steps, unit)
    theirs = torch_rates(scheduler(units - warmup), units, warmup)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-12)
    if unit == "epoch":  # the rate changes as an epoch starts, and not within it
        schedule = Schedule(config, steps, epochs)
        assert all(schedule.rate(e, s) == schedule.rate(e, 0) for e in range(epochs) for s in range(steps))


def test_the_closed_forms_at_chosen_units():
    cosine = Schedule(optimizer(type="cosine", unit="step", min_lr=0.01, warmup=4), 10, 3)  # T' = 26
    assert [cosine.rate(0, t) for t in range(4)] == [LR * (t + 1) / 4 for t in range(4)]
    assert cosine.rate(0, 4) == LR and math.isclose(cosine.rate(1, 7), 0.01 + 0.09 * (1 + math.cos(math.pi * 13 / 26)) / 2)
    step = Schedule(optimizer(type="step", milestones=[2, 5], gamma=0.1), 10, 8)
    assert [step.rate(e, 0) for e in range(7)] == [LR, LR, LR * 0.1, LR * 0.1, LR * 0.1, LR * 0.1 ** 2, LR * 0.1 ** 2]
    one = Schedule(optimizer(type="onecycle", unit="step", pct_start=0.3, div_factor=10, final_div_factor=100), 10, 10)
    rise = 0.3 * 100 - 1
    assert math.isclose(one.rate(0, 0), LR / 10) and math.isclose(one.rate(2, 9), LR)  # t = 29 = rise: the peak
    assert math.isclose(one.rate(9, 9), LR / 10 / 100) and one.rate(1, 0) < one.rate(1, 5) < LR  # t=10, 15 < rise
    assert rise == 29
    poly = Schedule(optimizer(type="polynomial", unit="step", power=0.5, min_lr=0.02), 5, 2)  # T' = 10
    assert math.isclose(poly.rate(0, 3), 0.02 + 0.08 * (1 - 3 / 10) ** 0.5)  # t = 3 of T' = 10


def test_lr_decay_is_the_exponential_schedule_by_epoch_and_the_updater_takes_the_rate():
    config = OptimizerConfig(type="sgd", lr=0.1, lr_decay=0.5).validate("test")
    schedule = Schedule(config, 10, 5)
    assert [schedule.rate(e, 3) for e in range(3)] == [0.1 * 0.5 ** e for e in range(3)]
    g, p = np.ones(3, np.float32), np.zeros(3, np.float32)
    updater = create_updater(config, p, np.ones(3, np.float32))
    updater.lr = schedule.rate(2, 0)
    np.testing.assert_allclose(updater.delta(g, p), -0.025 * g)


@pytest.mark.parametrize("monitor, values", [("loss", [1.0, 0.9, 0.9, 0.95, 0.91, 0.89, 0.9, 0.9, 0.9, 0.88, 0.9]),
                                             ("accuracy", [0.5, 0.6, 0.6, 0.59, 0.6, 0.61, 0.6, 0.6, 0.6, 0.6])])
def test_reduce_on_plateau_reduces_when_pytorchs_does(monitor, values):
    options = {"type": "reduce_on_plateau", "monitor": monitor, "patience": 1, "factor": 0.5, "cooldown": 1,
               "threshold": 0.01, "min_lr": 0.03}
    schedule = Schedule(optimizer(**options), 4, len(values) + 1)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    theirs = S.ReduceLROnPlateau(opt, "min" if monitor == "loss" else "max", factor=0.5, patience=1, threshold=0.01,
                                 threshold_mode="rel", cooldown=1, min_lr=0.03)
    ours, expected = [], []
    for epoch, value in enumerate(values):
        schedule.end_epoch({monitor: value, "other": 1.0})
        theirs.step(value)
        ours.append(schedule.rate(epoch + 1, 0))
        expected.append(opt.param_groups[0]["lr"])
    np.testing.assert_allclose(ours, expected, rtol=1e-12)
    assert min(ours) == 0.03 and ours[0] == LR  # it reduced twice: 0.05, then max(0.025, min_lr)


def test_the_plateau_counters_a_checkpoint_keeps_resume_the_same_rates():
    config = optimizer(type="reduce_on_plateau", patience=0, factor=0.5)
    losses = [1.0, 1.0, 0.5, 0.6, 0.7, 0.4, 0.4]
    whole = Schedule(config, 3, 8)
    for loss in losses:
        whole.end_epoch({"loss": loss})
    first = Schedule(config, 3, 8)
    for loss in losses[:4]:
        first.end_epoch({"loss": loss})
    resumed = Schedule(config, 3, 8)
    resumed.load_state(first.state())
    for loss in losses[4:]:
        resumed.end_epoch({"loss": loss})
    assert resumed.state() == whole.state() and resumed.rate(7, 0) == whole.rate(7, 0) == LR * 0.5 ** 4
    with pytest.raises(ConfigError, match=r"optimizer.schedule.monitor is 'loss', but .* expected one of \['auc'\]"):
        Schedule(config, 3, 8).end_epoch({"auc": 0.7, "accuracy": None})


@pytest.mark.parametrize("changes, message", [
    ({"lr_decay": 0.9, "schedule": ScheduleOptions(type="cosine")},
     r"optimizer.lr_decay is 0.9, expected 1 with optimizer.schedule.type cosine \(lr_decay is the exponential "
     r"schedule by epoch: schedule \{type: exponential, gamma: 0.9\}"),
    ({"schedule": ScheduleOptions(type="step")}, "optimizer.schedule.milestones is \\[\\], expected at least one"),
    ({"schedule": ScheduleOptions(type="step", milestones=[5, 3])}, "expected a list of increasing positive"),
    ({"schedule": ScheduleOptions(type="onecycle", warmup=2)}, "optimizer.schedule.warmup is 2, expected 0 with"),
    ({"schedule": ScheduleOptions(type="reduce_on_plateau", unit="step")}, "expected epoch with reduce_on_plateau"),
    ({"schedule": ScheduleOptions(type="cosine", gamma=0.0)}, r"optimizer.schedule.gamma is 0.0, expected a number"),
])
def test_a_schedule_out_of_its_domain_is_refused_naming_the_key(changes, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(OptimizerConfig(), **changes).validate("run.yaml")


def test_a_warm_up_as_long_as_the_run_is_refused():
    with pytest.raises(ConfigError, match=r"optimizer.schedule.warmup is 5 epochs, but the run has 5 \(5 epochs"):
        Schedule(optimizer(type="cosine", warmup=5), 10, 5)
