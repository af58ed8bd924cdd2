"""The training loop, as the story of a run: set up the run, train the epochs, finish.

    mpiexec -n 4 mpitrain train configs/fashion_mlp.yaml          # the command line
    summary = mpitrain.train(config, comm)                       # the same, from Python

`train` is a collective: every rank calls it. Rank 0 writes the run directory (config.yaml,
checkpoints/, metrics.jsonl, summary.json, the report). SIGUSR1 or SIGTERM on any rank stops
every rank at a step boundary with a checkpoint (`mpitrain.preemption`: `Stopped`, exit 3).
"""
from __future__ import annotations

import functools
import json
import logging
import os
import time
from dataclasses import dataclass, field

from mpitrain.allocations import AllocationTrace
from mpitrain.config import Config
from mpitrain.files import os_errors, write_file
from mpitrain.data import Batches, RankRows
from mpitrain.errors import ConfigError
from mpitrain.evaluation import Evaluation, evaluate
from mpitrain.metrics import MetricsLog, Totals, Traffic, Window, input_wait_ms, per_step
from mpitrain.nn.updaters import Updater, create_updater
from mpitrain.preemption import StopSignals, Stopped, requeue
from mpitrain.pretrain import pretrain
from mpitrain.run import Run, setup_run
from mpitrain.sync import Synchronizer, check_replicas, create_synchronizer, parameter_hash
from mpitrain.watchdog import Watchdog

log = logging.getLogger("mpitrain")


def train(config: Config, comm, *, reader=None, model=None, sync: Synchronizer | None = None) -> dict:
    """Train as `config` says on every rank of `comm` (a collective); returns the summary.

    `reader` (a DatasetReader), `model` (a Sequential) and `sync` (a Synchronizer built on
    the run's communicator) replace the parts the config would build (the Python API).
    """
    started = time.perf_counter()
    run = setup_run(config, comm, reader=reader, model=model)
    with run.owned():  # no other job writes this run directory meanwhile
        loop = _set_up_training(run, sync)
        if loop is None:
            return _summary_of_finished_run(run)
        done = _train_epochs(run, loop)
        return _finish(run, loop, done, started)


@dataclass
class _Loop:
    """What the epochs need beyond the run's parts: rows, batches, updater, synchronizer, metrics, start, and the
    allocation trace (`train.trace_allocations`)."""

    train_rows: RankRows
    test_rows: RankRows
    batches: Batches
    updater: Updater
    sync: Synchronizer
    metrics: MetricsLog
    epoch: int
    step: int
    allocations: AllocationTrace


@dataclass
class _Done:
    """What the epochs did on this rank: time and samples of training steps (and time waiting for batches),
    traffic, the last evaluation."""

    seconds: float = 0.0
    samples: int = 0
    steps: int = 0
    traffic: Traffic = Traffic()
    input_seconds: float = 0.0
    evaluation: Evaluation | None = None
    hashes: list = field(default_factory=list)


def _set_up_training(run: Run, sync: Synchronizer | None) -> _Loop:
    """Rows, batches, updater and synchronizer; resume or start (pretraining first when asked); config.yaml."""
    config, comm, model = run.config, run.comm, run.model
    with comm.agreed_errors():
        train_rows = run.reader.rows(config.data.train_split, training=True)
        test_rows = run.reader.rows(config.data.test_split, training=False)
        if config.data.augment and len(run.reader.manifest.feature_shape) != 3:
            raise ConfigError(f"data.augment flips and shifts images, but {run.reader.path} holds rows of "
                              f"shape {tuple(run.reader.manifest.feature_shape)}; expected images (channels, height, "
                              "width)")
        if len(train_rows.y) < config.train.batch_size:
            raise ConfigError(f"train.batch_size is {config.train.batch_size} (per rank), but each of the "
                              f"{comm.size} ranks has only {len(train_rows.y)} training rows")
        if sync is not None and sync.comm is not comm:
            raise ConfigError("the synchronizer was built on another communicator than the run's; build it on "
                              "the one mpitrain.init() returned")
    batches = run.batches(train_rows, config.train.batch_size, training=True)
    updater = create_updater(config.optimizer, model.params, model.decay_mask)
    sync = sync or create_synchronizer(config.sync, comm)
    config.sync = sync.config  # the run's config.yaml and summary say which mode ran

    model.init_params(config.train.seed, config.model.init)
    start = run.checkpointer.resume(model, updater, pretraining=bool(config.pretrain.layers))
    if start.epoch >= config.train.epochs and comm.bcast_obj(os.path.exists(_summary_path(config))):
        if comm.is_root:
            log.info("%s is finished: %d epochs trained, train.epochs is %d; its files are left as they are (a "
                     "larger train.epochs continues it)", config.run_dir, start.epoch, config.train.epochs)
        return None
    updater.iteration = start.iteration
    run.checkpointer.write_config(config)
    if comm.is_root:
        for option in config.ignored:
            log.warning("ignored: %s", option)
    if config.pretrain.layers and (start.epoch, start.step) == (0, 0):  # fine-tuning has not begun
        pretrain(config, comm, model, batches, train_rows, run.checkpointer)
    sync.start(model, updater)  # every rank starts from rank 0's parameters and updater state
    sync.load_numbers(start.sync_numbers)
    sync.load_arrays(start.sync_arrays)  # e.g. sharing's residual, saved by rank 0
    if comm.is_root:
        log.info("%d ranks, %d training rows per rank, %d steps per epoch, %d parameters, sync %s, backend %s%s",
                 comm.size, len(train_rows.y), batches.steps_per_epoch, model.n_params, config.sync.mode,
                 run.backend.name, ", collectives staged through host memory" if comm.staged else "")
    metrics = MetricsLog(config.run_dir, comm, batches.steps_per_epoch, config.train.epochs)
    return _Loop(train_rows, test_rows, batches, updater, sync, metrics, start.epoch, start.step,
                 AllocationTrace(config.train.trace_allocations))


def _train_epochs(run: Run, loop: _Loop) -> _Done:
    """The epochs from where the run starts: steps with their sync, metrics windows, checkpoints; at each
    epoch's end the sync's epoch work, the replica check, an evaluation and (by the cadence) a checkpoint."""
    config, comm, model, backend = run.config, run.comm, run.model, run.backend
    batches, sync, updater, metrics = loop.batches, loop.sync, loop.updater, loop.metrics
    done, start_step = _Done(), loop.step
    grads_ready = functools.partial(sync.grads_ready, model)  # backward tells the sync which gradients are done
    with Watchdog(config.train.watchdog_s, comm.rank, comm.abort) as watchdog, StopSignals(comm) as stop:
        for epoch in range(loop.epoch, config.train.epochs):
            metrics.start_epoch(epoch, start_step)
            updater.start_epoch(epoch)
            window, epoch_totals = Window(), Totals()
            tick = time.perf_counter()
            for step, (x, y) in enumerate(batches.epoch(epoch, start_step), start=start_step):
                waited = time.perf_counter() - tick  # for this batch: the prefetch was behind
                watchdog.beat(f"epoch {epoch + 1} step {step + 1}")
                before = Traffic.of(comm)
                with loop.allocations.span("step"):  # the step itself; its bookkeeping is a few Python objects
                    loss, correct = model.train_batch(x, y, key=(config.train.seed, comm.rank, epoch, step),
                                                      grads_ready=grads_ready)
                    sync.step(model, updater)
                now = time.perf_counter()
                window.add(step, loss, correct, len(y), now - tick, Traffic.of(comm) - before, waited)
                last = step + 1 == batches.steps_per_epoch
                stop_signal = stop.agreed()  # the same answer on every rank, in the same step
                if (step + 1) % config.train.log_every == 0 or last or stop_signal:
                    copied = time.perf_counter()
                    totals = window.totals(backend)  # the window's one device -> host copy ...
                    totals.seconds += time.perf_counter() - copied  # ... waits for its queued GPU work
                    metrics.window(epoch, step, totals, sync.metrics())
                    epoch_totals += totals
                    window = Window()
                if stop_signal:
                    watchdog.beat(f"the checkpoint of {stop_signal} at epoch {epoch + 1} step {step + 1}")
                    path = run.checkpointer.save(epoch, step + 1, model, updater, sync)
                    then = requeue(config.train.requeue, stop_signal) if comm.is_root else "resume with the same command"
                    raise Stopped(f"stopped by {stop_signal} at epoch {epoch + 1} step {step + 1}: wrote {path}; {then}")
                if config.checkpoint.unit == "step" and (step + 1) % config.checkpoint.every == 0 and not last:
                    run.checkpointer.save(epoch, step + 1, model, updater, sync)
                tick = time.perf_counter()
            watchdog.beat(f"the end of epoch {epoch + 1} (sync, replica check, evaluation, checkpoint)")
            before = Traffic.of(comm)
            sync.end_epoch(model, updater)
            done.traffic += epoch_totals.traffic + (Traffic.of(comm) - before)
            done.seconds += epoch_totals.seconds
            done.samples += epoch_totals.samples
            done.steps += epoch_totals.steps
            done.input_seconds += epoch_totals.input_seconds
            if sync.replicas_identical and config.sync.check_replicas:
                done.hashes = check_replicas(comm, *map(backend.to_host, (model.params, model.stats)))
            with loop.allocations.span("evaluation"):
                done.evaluation = _evaluate(run, loop)
            metrics.end_epoch({"epoch": epoch, "nodes": comm.nodes, "ranks_per_node": comm.local_size,
                               "train_loss": epoch_totals.loss_sum / max(epoch_totals.samples, 1),
                               "test_accuracy": done.evaluation.accuracy, "test_loss": done.evaluation.loss,
                               "replica_hashes": done.hashes})
            if epoch + 1 == config.train.epochs or (config.checkpoint.unit == "epoch"
                                                    and (epoch + 1) % config.checkpoint.every == 0):
                run.checkpointer.save(epoch + 1, 0, model, updater, sync)  # the end of training is always kept
            start_step = 0
    return done


def _evaluate(run: Run, loop: _Loop) -> Evaluation:
    return evaluate(run.model, loop.test_rows, loop.batches.to_model_input, 256, run.comm,
                    run.reader.manifest.num_classes, run.backend)


def _finish(run: Run, loop: _Loop, done: _Done, started: float) -> dict:
    """The summary over all ranks (a collective); rank 0 writes summary.json and the report."""
    config, comm, model, backend = run.config, run.comm, run.model, run.backend
    evaluation = done.evaluation or _evaluate(run, loop)  # resumed a finished run: evaluate what it left
    slowest = comm.max(done.seconds)
    summary = {
        "test_accuracy": evaluation.accuracy, "test_loss": evaluation.loss,
        "samples_per_s": sum(comm.allgather_obj(done.samples)) / slowest if slowest else 0.0,
        **per_step(comm.allgather_obj(done.traffic), done.steps),  # the ranks' mean
        "input_wait_ms_per_step": input_wait_ms(comm.allgather_obj(done.input_seconds), done.steps),
        "comm_ms_per_step": loop.metrics.comm_ms_per_step,
        "epochs": config.train.epochs, "ranks": comm.size, "nodes": comm.nodes,
        "ranks_per_node": comm.local_size, "sync_mode": config.sync.mode,
        "wall_s": comm.max(time.perf_counter() - started), "steps_per_epoch": loop.batches.steps_per_epoch,
        "n_params": model.n_params,
        "replica_hashes": comm.allgather_obj(parameter_hash(*map(backend.to_host, (model.params, model.stats)))),
        "backend": backend.name, "cuda_aware_mpi": comm.cuda_aware, "host_staging": comm.staged,
        "transfers": backend.transfers.to_dict(),
        "evaluation": evaluation.to_dict(),
    }
    if config.train.trace_allocations:  # the largest over the ranks, per span kind
        summary["allocated_bytes"] = {kind: max(worst.get(kind, 0) for worst in comm.allgather_obj(
            loop.allocations.worst())) for kind in ("step", "evaluation")}
    with comm.agreed_errors():
        if comm.is_root:
            write_file(_summary_path(config), lambda f: json.dump(summary, f, indent=2))
            log.info("test accuracy %.4f, %.0f samples/s, %.0f bytes sent per step per rank",
                     summary["test_accuracy"], summary["samples_per_s"], summary["bytes_sent_per_step"])
            if config.report:
                from mpitrain.report import write_report
                with os_errors(config.run_dir, "drawing the report"):
                    log.info("wrote %s and %s", *write_report([config.run_dir], config.run_dir))
    return summary


def _summary_path(config: Config) -> str:
    return os.path.join(config.run_dir, "summary.json")


def _summary_of_finished_run(run: Run) -> dict:
    """A finished run asked to train again touches nothing: the summary it wrote, on every rank (a collective)."""
    summary = None
    if run.comm.is_root:
        with open(_summary_path(run.config)) as f:
            summary = json.load(f)
    return run.comm.bcast_obj(summary)
