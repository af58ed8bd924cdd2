"""Gradient clipping by norm (`train.clip_norm`, `mpitrain.parallel.sync.base.clip_gradients`): the clipped step is the
updater's step on the gradient scaled by clip_norm / norm, in every sync mode (one rank here) and with embedding
tables stepped by their written rows; a gradient within the norm is untouched."""
import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig, OptimizerConfig, SyncConfig, load_config
from mpitrain.data.sequences import Inputs
from mpitrain.data.shards import InputGroup
from mpitrain.nn.graph import build_graph
from mpitrain.nn.layers import Dense
from mpitrain.nn.model import Sequential
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.backend import create_backend
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.sync import create_synchronizer
from mpitrain.parallel.sync.base import apply_update


def scaled_to(grads, clip_norm):
    """`grads` scaled to norm `clip_norm` as PyTorch's clip_grad_norm_ does: times clip_norm / (norm + 1e-6)."""
    return grads * (clip_norm / (np.linalg.norm(grads) + 1e-6))


OPTIMIZERS = [OptimizerConfig(type="sgd", lr=0.1, momentum=0.9, l2=1e-3), OptimizerConfig(type="adam", lr=0.01)]


def mlp_with_gradients(seed: int = 0):
    """A float64 MLP whose `grads` hold one batch's gradient."""
    rng = np.random.default_rng(seed)
    model = Sequential([Dense(6, activation="tanh"), Dense(3)], (4,), dtype="float64")
    model.init_params(seed, "xavier")
    model.train_batch(rng.normal(size=(8, 4)), rng.integers(0, 3, 8))
    return model


def stepped(model, optimizer, grads, clip_norm: float, sync_mode: str | None = None):
    """The parameters (and sharing's residual) after one step from `model`'s parameters on gradient `grads`, by
    apply_update or by a synchronizer of `sync_mode` on one rank."""
    params = model.params.copy()
    model.grads[...] = grads
    updater = create_updater(optimizer, model.params, model.decay_mask, clip_norm)
    residual = None
    if sync_mode is None:
        apply_update(model, updater)
    else:
        comm = Communicator(MPI.COMM_SELF).for_backend(create_backend("numpy"), False)
        sync = create_synchronizer(SyncConfig(mode=sync_mode, threshold=1e-3).validate("test"), comm)
        sync.start(model, updater)
        sync.step(model, updater)
        residual = getattr(sync, "residual", None)
        residual = None if residual is None else residual.copy()
    after = model.params.copy()
    model.params[...] = params
    return after, residual


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["momentum", "adam"])
def test_a_clipped_step_is_the_step_on_the_gradient_scaled_to_the_norm(optimizer):
    model = mlp_with_gradients()
    grads = model.grads.copy()
    norm = np.linalg.norm(grads)
    clipped, _ = stepped(model, optimizer, grads, clip_norm=norm / 4)
    np.testing.assert_allclose(model.grads, scaled_to(grads, norm / 4), rtol=1e-12)  # what the updater got
    assert np.linalg.norm(model.grads) == pytest.approx(norm / 4, rel=1e-5)  # 1e-6 below it: PyTorch's epsilon
    scaled, _ = stepped(model, optimizer, scaled_to(grads, norm / 4), clip_norm=0)
    np.testing.assert_allclose(clipped, scaled, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=["momentum", "adam"])
def test_a_gradient_within_the_norm_is_untouched(optimizer):
    model = mlp_with_gradients()
    grads = model.grads.copy()
    within, _ = stepped(model, optimizer, grads, clip_norm=np.linalg.norm(grads) * 1.01)
    assert np.array_equal(model.grads, grads)
    assert np.array_equal(within, stepped(model, optimizer, grads, clip_norm=0)[0])


@pytest.mark.parametrize("mode", ["none", "allreduce", "averaging", "sharing"])
def test_every_sync_mode_clips_what_it_hands_the_updater(mode):
    model = mlp_with_gradients(1)
    grads = model.grads.copy()
    clipped = stepped(model, OPTIMIZERS[0], grads, np.linalg.norm(grads) / 3, mode)
    scaled = stepped(model, OPTIMIZERS[0], scaled_to(grads, np.linalg.norm(grads) / 3), 0, mode)
    for a, b in zip(clipped, scaled):
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-15)
    assert not np.allclose(clipped[0], stepped(model, OPTIMIZERS[0], grads, 0, mode)[0])


def test_tables_stepped_by_their_written_rows_are_clipped_with_the_whole_gradient():
    graph = [{"name": "emb", "type": "embedding", "input": "categorical", "dim": 3},
             {"name": "flat", "type": "flatten", "input": "emb"},
             {"name": "joined", "type": "concat", "inputs": ["flat", "numeric"]},
             {"name": "out", "type": "dense", "input": "joined", "units": 1}]
    groups = {"numeric": InputGroup(0, (3,)), "categorical": InputGroup(0, (2,), (50, 40))}
    model = build_graph(ModelConfig(graph=graph, loss="binary_cross_entropy", dtype="float64"), groups, (3,), 1, np)
    model.init_params(0, "xavier")
    rng = np.random.default_rng(0)
    x = Inputs(rng.normal(size=(6, 3)), {"categorical": np.column_stack([rng.integers(0, 50, 6),
                                                                          rng.integers(0, 40, 6)]).astype(np.int32)})
    model.train_batch(x, rng.integers(0, 2, (6, 1)).astype(np.float64))
    assert all(table.written is not None for table in model.sparse_tables)  # plain SGD steps only these rows
    grads = model.grads.copy()
    sgd = OptimizerConfig(type="sgd", lr=0.5)
    clipped, _ = stepped(model, sgd, grads, np.linalg.norm(grads) / 5)
    scaled, _ = stepped(model, sgd, scaled_to(grads, np.linalg.norm(grads) / 5), 0)
    np.testing.assert_allclose(clipped, scaled, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("value, message", [("-1", r"train.clip_norm is -1.0, expected a number in \[0, 1e6\]"),
                                            (".inf", r"train.clip_norm is inf, expected a finite number")])
def test_clip_norm_out_of_its_domain_is_one_config_error(tmp_path, value, message):
    path = tmp_path / "exp.yaml"
    path.write_text(f"data: {{path: d}}\nmodel: {{layers: [{{type: dense, units: 2}}]}}\ntrain: {{clip_norm: {value}}}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(str(path))
    assert load_config(str(path), ["train.clip_norm=2.5"]).train.clip_norm == 2.5
