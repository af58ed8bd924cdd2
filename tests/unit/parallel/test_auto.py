"""`sync.mode: auto` (mpitrain/parallel/sync/auto.py) without a network: the choice is the least lossy candidate whose
expected step is within SLACK of the fastest; an untried mode is expected to make the step without communication
plus its calibrated prediction; the cost model's predictions on stated networks order the candidates as their bytes
do; a two-point fit gives back the network it was timed on; auto is refused for pretraining."""
import numpy as np
import pytest

import mpitrain.parallel.sync.auto as auto_module
from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import PretrainConfig, SyncConfig
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential
from mpitrain.parallel.costmodel import Network
from mpitrain.parallel.sync.auto import CHOICES, SLACK, AutoSync, choose, fitted


class FourRanks:
    size, rank, comm_seconds = 4, 0, 0.0


def test_the_least_lossy_candidate_within_the_slack_of_the_fastest_step_is_chosen():
    assert list(CHOICES) == ["dense", "bf16", "sharing", "powersgd", "averaging"]  # sharing measured less lossy
    assert SLACK == 0.10
    steps = {"dense": 10.0, "bf16": 10.1, "sharing": 10.0, "powersgd": 9.2, "averaging": 9.5}
    assert choose(steps) == "dense"  # 10.0 <= 1.1 x 9.2: the least lossy hides its communication well enough
    assert choose({**steps, "dense": 10.2}) == "bf16"  # 10.2 > 10.12
    assert choose({**steps, "dense": 12.0, "bf16": 12.0}) == "sharing"
    assert choose({**steps, "dense": 12.0, "bf16": 12.0, "sharing": 11.0}) == "powersgd"
    assert choose({**steps, "averaging": 5.0}) == "averaging"  # the only one within 5.5 ms


def test_predictions_on_a_fast_and_a_slow_network_pick_dense_and_a_compression():
    model = Sequential([Dense(256, activation="relu"), Dense(256, activation="relu"), Dense(10)], (64,),
                       "softmax_cross_entropy", np)
    auto = AutoSync(FourRanks(), SyncConfig(mode="auto").validate("run.yaml"))
    fast, slow = Network.of(1.0, 100.0), Network.of(50.0, 0.1)
    on_fast, on_slow = auto.predicted_ms(fast, model), auto.predicted_ms(slow, model)
    assert on_slow["dense"] > on_slow["bf16"] > on_slow["powersgd"] and on_slow["dense"] > on_slow["averaging"] * 0.99
    compute_ms = 20.0  # the step without communication
    assert choose({name: compute_ms + ms for name, ms in on_fast.items()}) == "dense"
    assert choose({name: compute_ms + ms for name, ms in on_slow.items()}) == "sharing"


def test_a_two_point_fit_gives_back_the_network_it_was_timed_on():
    network = Network.of(30.0, 2.0)
    times = [(size, network.allreduce(size, 4)) for size in (4096, 1 << 20)]
    got = fitted(times, 4)
    assert got.latency_us == pytest.approx(30.0, rel=0.05) and got.gbps == pytest.approx(2.0, rel=0.05)


def test_auto_is_not_offered_for_pretraining():
    with pytest.raises(ConfigError, match=r"pretrain.sync.mode is 'auto', expected allreduce, averaging, sharing or "
                                          r"none"):
        PretrainConfig(layers=[8], sync=SyncConfig(mode="auto")).validate("run.yaml")


def started_auto():
    """A small MLP, its SGD updater, and `sync.mode: auto` started on this process's ranks (one, under pytest)."""
    from mpi4py import MPI

    from mpitrain.config.sections import OptimizerConfig
    from mpitrain.nn.updaters import create_updater
    from mpitrain.parallel.comm import Communicator
    model = Sequential([Dense(8, activation="relu"), Dense(3)], (5,), "softmax_cross_entropy", np)
    model.init_params(0, "xavier")
    updater = create_updater(OptimizerConfig(type="sgd", lr=0.1), model.params, model.decay_mask)
    auto = AutoSync(Communicator(MPI.COMM_WORLD.Dup()), SyncConfig(mode="auto").validate("run.yaml"))
    auto.start(model, updater)
    return model, updater, auto


def test_a_checkpoints_choice_is_taken_back_with_its_modes_state():
    model, updater, auto = started_auto()
    saved = auto.state()
    assert saved == {"auto_choice": 0, "auto_free_ms": 0.0, "auto_calibration": 1.0} and auto.summary() == {"sync_auto": []}
    auto.load_state({"auto_choice": 3, "tau": 0.25, "steps": 7}, {})  # a checkpoint taken while sharing ran
    assert auto.choice == "sharing" and auto.inner.tau == 0.25 and auto.state()["auto_choice"] == 3
    x, y = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32), np.array([0, 1, 2, 0], np.int32)
    model.train_batch(x, y)
    auto.step(model, updater)
    auto.end_epoch(model, updater)  # one rank: every prediction is 0, so dense fits again
    assert auto.choice == "dense" and [r["ran"] for r in auto.summary()["sync_auto"]] == ["sharing"]


def test_a_mode_measured_slower_than_the_step_is_not_chosen_again_on_its_prediction():
    model, updater, auto = started_auto()
    auto.steps, auto.step_s, auto.compute_s = 1, 0.051, 0.001  # a 51 ms step: 1 ms of compute, 50 ms inside MPI
    auto.mpi_s = 0.05
    auto.end_epoch(model, updater)  # one rank: every prediction is 0, dense's too, but dense was measured at 51
    record = auto.summary()["sync_auto"][-1]
    assert record["comm_ms_predicted"] < 1 < 50 < record["expected_step_ms"]["dense"] < 52
    assert 0.9 < record["expected_step_ms"]["bf16"] < 1.1 and record["next"] == "bf16"  # untried: the free step
    assert auto.choice == "bf16" and 50 < auto.state()["auto_measured_dense"] < 52
    assert 0.9 < auto.state()["auto_free_ms"] < 1.1
    again = AutoSync(auto.comm, SyncConfig(mode="auto").validate("run.yaml"))
    again.start(model, updater)
    again.load_state(auto.state(), {})  # a resume keeps what was measured: dense stays out
    assert again.choice == "bf16" and again.measured == auto.measured and again.free_ms == auto.free_ms
    again.steps, again.step_s, again.compute_s = 1, 0.001, 0.001  # bf16 as short as the step without MPI
    again.end_epoch(model, updater)
    assert again.choice == "bf16" and again.summary()["sync_auto"][-1]["expected_step_ms"]["dense"] > 50


def test_an_untried_mode_is_expected_at_its_prediction_times_the_worst_measured_ratio(monkeypatch):
    model, updater, auto = started_auto()
    network = Network.of(10.0, 1.0)
    monkeypatch.setattr(auto_module, "measure_network", lambda comm, nbytes, xp: network)
    monkeypatch.setattr(auto.comm, "size", 4)  # predictions for four ranks; the collectives are this process's
    predicted = auto.predicted_ms(network, model)
    auto.steps, auto.step_s, auto.compute_s = 1, 0.004 + 3e-3 * predicted["dense"], 0.004
    auto.mpi_s = 3e-3 * predicted["dense"]  # MPI took 3x the prediction
    auto.end_epoch(model, updater)
    expected = auto.summary()["sync_auto"][-1]["expected_step_ms"]
    assert auto.calibration == pytest.approx(3.0)
    assert expected["sharing"] == pytest.approx(4.0 + 3.0 * predicted["sharing"])
    assert expected["dense"] == pytest.approx(4.0 + 3.0 * predicted["dense"])
