"""Early stopping's counters (mpitrain/training/early_stopping.py): improvements by more than min_delta in the
metric's own direction, patience, the evaluation points by epoch or by step, the state a checkpoint keeps."""
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import EarlyStoppingOptions, TrainConfig
from mpitrain.training.early_stopping import EarlyStopping


def observed(values, **options):
    stopping = EarlyStopping(EarlyStoppingOptions(**options))
    improved = [stopping.observe({options["monitor"]: value, "other": 0.0}, epoch + 1, 0)
                for epoch, value in enumerate(values) if not stopping.stop]
    return stopping, improved


def test_a_lower_is_better_metric_stops_after_patience_evaluations_without_an_improvement_beyond_min_delta():
    stopping, improved = observed([1.0, 0.8, 0.79, 0.85, 0.7, 0.75, 0.71, 0.9], monitor="loss", patience=2,
                                  min_delta=0.05)
    assert improved == [True, True, False, False]  # 0.79 is within min_delta of 0.8, 0.85 is worse
    assert stopping.stop and stopping.best == 0.8 and stopping.best_at == [2, 0] and stopping.stopped_at == [4, 0]


def test_a_higher_is_better_metric_waits_again_after_each_improvement():
    stopping, improved = observed([0.5, 0.6, 0.6, 0.7, 0.69, 0.68, 0.71], monitor="accuracy", patience=3)
    assert improved == [True, True, False, True, False, False, True] and not stopping.stop
    assert stopping.best == 0.71 and stopping.waited == 0


def test_the_state_a_checkpoint_keeps_continues_the_count():
    first, _ = observed([0.5, 0.4, 0.45], monitor="loss", patience=2)
    resumed = EarlyStopping(EarlyStoppingOptions(monitor="loss", patience=2))
    resumed.load_state(first.state())
    assert resumed.observe({"loss": 0.41}, 4, 0) is False and resumed.stop and resumed.best_at == [2, 0]
    assert EarlyStopping(EarlyStoppingOptions()).on is False


def test_the_evaluation_points_by_epoch_and_by_step():
    by_epoch = EarlyStopping(EarlyStoppingOptions(monitor="loss", unit="epoch", every=2))
    assert [by_epoch.due(epoch, 4, 5, epoch_end=True) for epoch in range(4)] == [False, True, False, True]
    assert not by_epoch.due(1, 2, 5, epoch_end=False)  # never after a step within an epoch
    by_step = EarlyStopping(EarlyStoppingOptions(monitor="loss", unit="step", every=3))  # the run's step + 1 % 3
    assert [by_step.due(epoch, step, 5, step == 4) for epoch, step in ((0, 1), (0, 2), (1, 0), (1, 3), (1, 4))] \
        == [False, True, True, True, False]


def test_a_monitor_the_evaluation_lacks_and_a_malformed_one_are_refused():
    stopping = EarlyStopping(EarlyStoppingOptions(monitor="auc"))
    with pytest.raises(ConfigError, match=r"monitor is 'auc', but the evaluation has no such number; expected one of "
                                          r"\['accuracy', 'loss'\]"):
        stopping.observe({"loss": 1.0, "accuracy": 0.5, "confusion": [[1]]}, 1, 0)
    with pytest.raises(ConfigError, match="train.early_stopping.monitor is 'test loss', expected the name of a metric"):
        TrainConfig(early_stopping=EarlyStoppingOptions(monitor="test loss")).validate("run.yaml")
