"""Greedy layer-wise pretraining of a deep belief net, then its RBMs become the network's hidden layers.

The seeds' Hadoop DBN job, on MPI: rank 0's initial RBM weights go to every rank; each rank
trains the layer on its own rows; the ranks keep one RBM by the synchronizer of
`pretrain.sync` (default `averaging` once per epoch, the seeds' IterativeReduce scheme; any
mode works, the RBM has one flat buffer like any model). After `pretrain.epochs` epochs the
next RBM trains on the previous layers' mean activations (or samples from them:
`pretrain.propagate`), which each rank computes from its own rows, batch by batch: nothing
is gathered. Finally RBM k's weights and hidden biases become the k-th dense layer (sigmoid)
of the supervised model, which `mpitrain.training.loop` fine-tunes with backpropagation.

Each finished layer is checkpointed to RUN_DIR/pretrain/layer-LL.h5 (atomically, by rank 0),
so a resumed run skips finished layers; a layer interrupted half way starts again. Every step agrees on the
stop signals like a training step (`mpitrain.training.preemption`): SIGUSR1, SIGTERM or SIGINT ends pretraining on every
rank one or two steps later, with exit status 3, the finished layers kept. A
checkpoint taken on another dataset or of another shape is refused, saying what differs.
After every epoch, metrics.jsonl gets a `pretrain` record: reconstruction error (mean
squared error per visible unit of the mean-field reconstruction, on `monitor_rows` rows per
rank, after the epoch's sync), the same measured during training, and for Bernoulli RBMs
of at most `pll_max_visible` visible units the pseudo-log-likelihood per row.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from mpitrain.base.errors import ConfigError, MpitrainError
from mpitrain.config.sections import OptimizerConfig
from mpitrain.nn.layers import Dense, Sigmoid
from mpitrain.nn.rbm import RBM, bernoulli
from mpitrain.nn.updaters import create_updater
from mpitrain.parallel.sync import check_replicas, create_synchronizer
from mpitrain.rundir.directory import RunDir
from mpitrain.training.metrics import MetricsLog
from mpitrain.training.preemption import Stopped, requeue

log = logging.getLogger("mpitrain")


def dbn_layers(sizes: list[int], num_classes: int) -> list[dict]:
    """model.layers of a deep belief net: sigmoid dense layers of `sizes` units, then the softmax output."""
    return [{"type": "dense", "units": units, "activation": "sigmoid"} for units in sizes] + \
           [{"type": "dense", "units": num_classes}]


def pretrain(config, comm, model, batches, rows, checkpointer, watchdog, stop) -> None:
    """Pretrain the RBMs of `config.pretrain.layers` greedily (resuming finished ones, which `checkpointer`
    keeps) and copy them into `model`'s hidden layers. A collective: every rank calls it with its own
    training batches and its share of the training split in order (`rows`, an EvalRows: the monitor rows are
    its first `pretrain.monitor_rows`); the run's `watchdog` hears of every step, and every step agrees on the
    stop signals (`stop`, a StopSignals): a signal ends pretraining on every rank, the finished layers kept."""
    p = config.pretrain
    hidden = _hidden_layers(model, p.layers)
    sizes = [hidden[0].params["W"].shape[0], *p.layers]
    stack = [RBM(n_visible, n_hidden, model.xp, visible=p.visible if index == 0 else "bernoulli", cd_k=p.cd_k,
                 persistent=p.persistent, sample_visible=p.sample_visible, sparsity_target=p.sparsity_target,
                 sparsity_cost=p.sparsity_cost if p.sparsity_target else 0.0, dtype=model.params.dtype)
             for index, (n_visible, n_hidden) in enumerate(zip(sizes, sizes[1:]))]
    with comm.agreed_errors():
        stored, _ = rows.first(p.monitor_rows or len(rows))
        _check_input_range(config, stored, batches)
        finished = checkpointer.finished_layers([_layout(rbm, index) for index, rbm in enumerate(stack)]) \
            if comm.is_root else []
    finished = comm.bcast_obj(finished)  # after the agreed errors: every rank gets here, or none
    monitor = batches.to_model_input(stored)
    monitor = monitor.reshape(len(monitor), -1)
    for index, rbm in enumerate(stack):
        if index < len(finished):
            rbm.params[...] = model.xp.asarray(finished[index])
            log.info("pretrain layer %d/%d: loaded %s", index + 1, len(stack), checkpointer.files.pretrained_layer(index))
        else:
            _train_layer(config, comm, stack, index, batches, monitor, watchdog, stop)
            if comm.is_root:  # the replicas agree after the last epoch's sync
                path = checkpointer.save_layer(index, _layout(rbm, index), batches.backend.to_host(rbm.params),
                                               config.pretrain.epochs)
                log.info("pretrain layer %d: wrote %s", index + 1, path)
        monitor = rbm.hidden_probs(monitor)
    for rbm, dense in zip(stack, hidden):
        dense.params["W"][...] = rbm.W
        dense.params["b"][...] = rbm.c


def _hidden_layers(model, sizes: list[int]) -> list[Dense]:
    """The model's first len(sizes) parameter layers, checked to be sigmoid dense layers of those sizes."""
    with_params = [i for i, layer in enumerate(model.layers) if layer.params]
    for k, units in enumerate(sizes):
        i = with_params[k] if k < len(with_params) else None
        layer = model.layers[i] if i is not None else None
        after = model.layers[i + 1] if i is not None and i + 1 < len(model.layers) else None
        if not (isinstance(layer, Dense) and layer.units == units and isinstance(after, Sigmoid)):
            found = "missing" if layer is None else f"a {type(layer).__name__.lower()} layer" + (
                f" of {layer.units} units followed by " + (f"a {type(after).__name__.lower()} layer" if after
                                                            else "nothing") if isinstance(layer, Dense) else "")
            raise ConfigError(f"pretrain.layers is {sizes}: model.layers must begin with dense layers of these units, "
                              f"each with activation: sigmoid (the RBMs' hidden units), then the output layer; "
                              f"its parameter layer {k + 1} is {found} (leave model.layers out to have them built)")
    if len(with_params) == len(sizes):
        raise ConfigError(f"pretrain.layers is {sizes}: model.layers needs an output layer after these "
                          f"{len(sizes)} layers")
    return [model.layers[i] for i in with_params[:len(sizes)]]


def _check_input_range(config, stored, batches) -> None:
    """Bernoulli visible units read inputs as probabilities: they must lie in [0, 1] (checked on the monitor rows,
    `stored`, the rows each rank holds at once)."""
    if config.pretrain.visible != "bernoulli" or not len(stored):
        return
    low = float(stored.min()) * batches.scale + batches.shift
    high = float(stored.max()) * batches.scale + batches.shift
    if low < -1e-6 or high > 1 + 1e-6:
        raise MpitrainError(f"{config.data.path}: inputs range over [{low:.4g}, {high:.4g}], but "
                            "pretrain.visible: bernoulli needs inputs in [0, 1] (the manifest's scale/offset "
                            "should map them there; or use pretrain.visible: gaussian)")


def _layout(rbm: RBM, index: int) -> list:
    return [(f"{index:02d}_rbm/{name}", shape) for name, shape in rbm.layout]


def _train_layer(config, comm, stack: list[RBM], index: int, batches, monitor, watchdog, stop) -> None:
    """Train RBM `index` for pretrain.epochs epochs on the layers below's activations of this rank's batches; stop
    every rank (`Stopped`) one or two steps after a signal (`stop.agreed`)."""
    p, rbm, below = config.pretrain, stack[index], stack[:index]
    updater = create_updater(OptimizerConfig(type="sgd", lr=p.lr, momentum=p.momentum, l2=p.weight_decay),
                             rbm.params, rbm.decay_mask)
    sync = create_synchronizer(p.sync, comm)
    visible_mean = rbm.xp.asarray(monitor.mean(axis=0), dtype=np.float64)
    comm.average_(visible_mean)
    rbm.init_params((config.train.seed, index), visible_mean)
    sync.start(rbm, updater)  # every rank starts from rank 0's RBM
    metrics = MetricsLog(config.run_dir, comm, batches.steps_per_epoch, p.epochs)
    for epoch in range(p.epochs):
        rng = backend_rng(rbm.xp, config.train.seed, index, epoch, comm.rank)
        error, samples, seconds, bytes_sent = 0.0, 0, 0.0, 0  # error: a device scalar, read once per epoch
        for step, (x, _) in enumerate(batches.epoch(epoch)):
            watchdog.beat(f"pretrain layer {index + 1} epoch {epoch + 1} step {step + 1}")
            tick, bytes_before = time.perf_counter(), comm.bytes_sent
            v = propagate(below, x.reshape(len(x), -1), rng if p.propagate == "sample" else None)
            error += rbm.train_batch(v, rng)
            sync.step(rbm, updater)
            signal_name = stop.agreed()  # the same answer on every rank, in the same step
            if signal_name:
                raise _stopped(config, comm, index, f"epoch {epoch + 1} step {step + 1}", signal_name)
            samples += len(x)
            seconds += time.perf_counter() - tick
            bytes_sent += comm.bytes_sent - bytes_before
        watchdog.beat(f"the end of pretrain layer {index + 1} epoch {epoch + 1}")
        bytes_before = comm.bytes_sent
        sync.end_epoch(rbm, updater)
        bytes_sent += comm.bytes_sent - bytes_before
        to_host = batches.backend.to_host
        hashes = check_replicas(comm, to_host(rbm.params)) if sync.replicas_identical and p.sync.check_replicas \
            else []
        record = _epoch_record(config, comm, rbm, index, epoch, monitor, float(to_host(error)), samples, seconds,
                               bytes_sent / max(batches.steps_per_epoch, 1))
        _write_record(config, comm, metrics, {**record, "replica_hashes": hashes}, len(stack))


def _stopped(config, comm, index: int, where: str, signal_name: str) -> Stopped:
    """The stop of pretraining RBM `index` at `where`, before fine-tuning's first step: the layers below it are
    saved, it starts again on resume."""
    kept = [RunDir(config.run_dir).pretrained_layer(i) for i in range(index)]
    saved = f"kept {', '.join(kept)}" if kept else "nothing to save"
    then = requeue(config.train.requeue, signal_name, comm.is_root, "it resumes with the layers kept")
    return Stopped(f"stopped by {signal_name} in pretraining at layer {index + 1} {where}, before the first step, "
                   f"{saved}; layer {index + 1} starts again; {then}")


def propagate(below: list[RBM], v, rng=None):
    """The input of the next RBM: mean activations of the RBMs `below`, or samples from them when `rng` is given."""
    for rbm in below:
        v = rbm.hidden_probs(v)
        if rng is not None:
            v = bernoulli(v, rng)
    return v


def backend_rng(xp, *key: int):
    """A random generator of the array module `xp`, seeded by `key` (e.g. seed, layer, epoch, rank)."""
    return xp.random.default_rng(int(np.random.SeedSequence(list(key)).generate_state(1)[0]))


def _epoch_record(config, comm, rbm: RBM, index: int, epoch: int, monitor, train_error: float, samples: int,
                  seconds: float, bytes_per_step: float) -> dict:
    """The epoch's numbers over all ranks (a collective): errors are summed, then divided by rows x units."""
    pll = rbm.visible == "bernoulli" and rbm.n_visible <= config.pretrain.pll_max_visible
    sums = np.array([train_error, samples, rbm.reconstruction_error(monitor), len(monitor),
                     rbm.pseudo_log_likelihood(monitor) if pll else 0.0])
    comm.allreduce_(sums)
    slowest = comm.max(seconds)
    return {"kind": "pretrain", "layer": index, "epoch": epoch,
            "reconstruction_error": sums[2] / (sums[3] * rbm.n_visible),
            "train_reconstruction_error": sums[0] / (sums[1] * rbm.n_visible),
            "pseudo_log_likelihood": sums[4] / sums[3] if pll else None,
            "samples_per_s": sums[1] / slowest if slowest else 0.0, "bytes_sent_per_step": bytes_per_step,
            "n_visible": rbm.n_visible, "n_hidden": rbm.n_hidden}


def _write_record(config, comm, metrics: MetricsLog, record: dict, layers: int) -> None:
    """Rank 0 appends the record to metrics.jsonl; a non-finite error stops every rank (all see the same sums)."""
    where = f"pretrain layer {record['layer'] + 1}/{layers} epoch {record['epoch'] + 1}/{config.pretrain.epochs}"
    if not np.isfinite(record["reconstruction_error"]):
        raise MpitrainError(f"{where}: the RBM diverged (reconstruction error {record['reconstruction_error']}); "
                            "no layer checkpoint is written; try a lower pretrain.lr")
    metrics.write(record)
    if comm.is_root:
        pll = record["pseudo_log_likelihood"]
        log.info("%s: reconstruction error %.5f (during training %.5f)%s, %.0f samples/s", where,
                 record["reconstruction_error"], record["train_reconstruction_error"],
                 "" if pll is None else f", pseudo-log-likelihood {pll:.3f}", record["samples_per_s"])
