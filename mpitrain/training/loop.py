"""The training loop, as the story of a run: set up the run, train the epochs, finish.

    mpiexec -n 4 mpitrain train configs/fashion_mlp.yaml          # the command line
    summary = mpitrain.train(config, comm)                       # the same, from Python

`train` is a collective: every rank calls it. Rank 0 writes the run directory (config.yaml,
checkpoints/, metrics.jsonl, summary.json, the report). SIGUSR1, SIGTERM or SIGINT on any rank, at any moment, stops
every rank (`mpitrain.training.preemption`: `Stopped`, exit 3): before the first step with nothing to save, at a
step boundary with a checkpoint, after the last step once the summary and the report are written.
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import resource
import time
from dataclasses import dataclass, field

import numpy as np

from mpitrain.base.errors import ConfigError, DataError, MpitrainError
from mpitrain.base.files import os_errors, write_file
from mpitrain.config.sections import Config, ignored_options
from mpitrain.data.reader import Batches
from mpitrain.data.stream import EvalRows
from mpitrain.nn.schedules import Schedule
from mpitrain.nn.updaters import Updater, create_updater
from mpitrain.parallel.rollcall import CHECKPOINT, DATA_READ, EVALUATION, STEP, SUMMARY
from mpitrain.parallel.sync import Synchronizer, check_replicas, create_synchronizer, parameter_hash
from mpitrain.rundir.directory import RunDir
from mpitrain.training.accumulation import micro_batch
from mpitrain.training.allocations import AllocationTrace
from mpitrain.training.early_stopping import EarlyStopping
from mpitrain.training.evaluation import EVAL_BATCH_SIZE, Evaluation, evaluate
from mpitrain.training.metrics import MetricsLog, Totals, Traffic, Window, figure, mean_ms_per_step, per_step
from mpitrain.training.preemption import Stopped, StopSignals, requeue
from mpitrain.training.pretrain import pretrain
from mpitrain.training.run import Run, setup_run
from mpitrain.training.step_graph import graphed
from mpitrain.training.steps import Stepper, batch_stepper
from mpitrain.training.watchdog import Watchdog

log = logging.getLogger("mpitrain")


def train(config: Config, comm, *, reader=None, model=None, sync: Synchronizer | None = None,
          on_epoch=None) -> dict:
    """Train as `config` says on every rank of `comm` (a collective); returns the summary.

    `reader` (a DatasetReader), `model` (a Sequential) and `sync` (a Synchronizer built on
    the run's communicator) replace the parts the config would build (the Python API).
    SIGUSR1, SIGTERM or SIGINT (Ctrl-C) on any rank while it runs raises `Stopped` on every rank, with a checkpoint of the step it
    stopped at when there is one (`mpitrain.training.preemption`). For the call's duration mpitrain's handlers
    replace the caller's, which come back when it returns, unless `hold_stop_signals()` holds them for the
    whole process, as the command line does.
    `on_epoch(epoch, record)` is called on every rank after each epoch's record (metrics.jsonl's) and
    checkpoint: a point where all ranks are together, so it may run collectives, and an exception it raises on
    every rank (a study's prune decision, `mpitrain.tune.worker`) ends training there on all of them.
    """
    started = time.perf_counter()
    with StopSignals(comm) as stop, Watchdog(config.train.watchdog_s, comm.rank, comm.abort, calls=comm.calls,
                                             ranks=comm.size, run_dir=config.run_dir) as watchdog:
        watchdog.beat("start-up (the dataset's manifest, the model, the run directory)")  # a stuck rank anywhere
        run = setup_run(config, comm, reader=reader, model=model, sync=sync)
        try:
            with run.comm.agreed_errors():  # before the run directory is touched: a setting that does not fit
                _check_setup(run, sync)     # writes nothing
                batches = run.train_batches()
                test_rows = run.reader.eval_rows(run.config.data.test_split)
            with run.owned():  # no other job writes this run directory meanwhile
                watchdog.beat("start-up (resuming, pretraining, the first broadcast)")
                loop = _set_up_training(run, batches, test_rows, sync, watchdog, stop)
                _stop_before_first_step(run, stop)
                if loop is None:
                    return _summary_of_finished_run(run)
                done = _train_epochs(run, loop, watchdog, stop, on_epoch)
                watchdog.beat("the summary (every rank's figures, summary.json, the report)")
                summary = _finish(run, loop, done, started)
                _stop_after_last_step(run, stop)
                return summary
        finally:
            run.reader.close()  # the shards' files (and a remote store's connections) before the interpreter ends


@dataclass
class _Loop:
    """What the epochs need beyond the run's parts: batches, test rows, updater, synchronizer, metrics, start, the
    allocation trace (`train.trace_allocations`), how a step trains on its batch (whole, or by truncated BPTT), and
    the learning rate's schedule and early stopping's counters."""

    batches: Batches
    test_rows: EvalRows
    updater: Updater
    sync: Synchronizer
    metrics: MetricsLog
    epoch: int
    step: int
    allocations: AllocationTrace
    stepper: Stepper
    schedule: Schedule
    stopping: EarlyStopping

    def state(self) -> dict:
        """What a checkpoint keeps of the loop's own counters (`Position.loop_state`)."""
        return {"schedule": self.schedule.state(), "early_stopping": self.stopping.state()}


@dataclass
class _Done:
    """What the epochs did on this rank: time and samples of training steps (and time waiting for batches),
    traffic, the last evaluation."""

    seconds: float = 0.0
    samples: int = 0
    steps: int = 0
    traffic: Traffic = Traffic()
    input_seconds: float = 0.0
    host_seconds: float = 0.0
    evaluation: Evaluation | None = None
    hashes: list = field(default_factory=list)


def _check_setup(run: Run, sync: Synchronizer | None) -> None:
    """What the config asks that the dataset or the caller's parts cannot give: a ConfigError."""
    if run.config.data.augment and len(run.reader.manifest.feature_shape) != 3:
        raise ConfigError(f"data.augment flips and shifts images, but {run.reader.path} holds rows of "
                          f"shape {tuple(run.reader.manifest.feature_shape)}; expected images (channels, height, "
                          "width)")
    if sync is not None and sync.comm is not run.comm:
        raise ConfigError("the synchronizer was built on another communicator than the run's; build it on "
                          "the one mpitrain.init() returned")


def _set_up_training(run: Run, batches: Batches, test_rows: EvalRows, sync: Synchronizer | None,
                     watchdog: Watchdog, stop: StopSignals) -> _Loop:
    """Updater and synchronizer; resume (in the epoch order the checkpoint stopped in) or start (pretraining first
    when asked, its steps agreeing on `stop`); config.yaml."""
    config, comm, model = run.config, run.comm, run.model
    trainable = model.trainable  # the updater and the synchronizer see no frozen parameter
    updater = create_updater(config.optimizer, trainable.params, lambda: trainable.decay_mask,  # built if needed
                             config.train.clip_norm)
    for table in model.sharded_tables:  # their rows' own state, stepped by the run's updater (`apply_update`)
        table.take_updater(config.optimizer)
    sync = sync or create_synchronizer(config.sync, comm)

    model.init_params(config.train.seed, config.model.init)
    start = run.checkpointer.resume(model, updater, config, pretraining=bool(config.pretrain.layers))
    stopping = EarlyStopping(config.train.early_stopping)
    stopping.load_state(start.loop_state.get("early_stopping", {}))
    stopped_early = stopping.stop and stopping.on
    finished = start.epoch >= config.train.epochs or stopped_early
    if finished and comm.bcast_obj(comm.is_root and _summary_is_current(run)):
        if comm.is_root and stopped_early:
            log.info("%s is finished: early stopping ended it after %d epochs (%s did not improve); its files are "
                     "left as they are", config.run_dir, start.epoch, config.train.early_stopping.monitor)
        elif comm.is_root:
            log.info("%s is finished: %d epochs trained, train.epochs is %d; its files are left as they are (a "
                     "larger train.epochs continues it)", config.run_dir, start.epoch, config.train.epochs)
        return None
    if finished and comm.is_root:  # the job that trained it failed after the last step (`_records_missing`)
        log.info("%s is finished but has no summary.json of its last checkpoint: writing its missing records, "
                 "without training", config.run_dir)
    if config.model.init_from and start.iteration == 0:  # a fresh start: rank 0's arrays reach every rank at start
        with comm.agreed_errors():
            if comm.is_root:
                run.checkpointer.init_from(model, config.model.init_from)
    updater.iteration = start.iteration
    batches = _continue_order(run, batches, start)
    run.checkpointer.write_config(config)
    if comm.is_root:
        for option in ignored_options(config):
            log.warning("ignored: %s", option)
    if config.pretrain.layers and (start.epoch, start.step) == (0, 0):  # fine-tuning has not begun
        pretrain(config, comm, model, batches, run.reader.eval_rows(config.data.train_split), run.checkpointer,
                 watchdog, stop)
    if model.trainable_start:  # frozen parameters, rank 0's (init_from's, a checkpoint's): broadcast once, here
        comm.bcast_(model.params[:model.trainable_start])
    sync.start(trainable, updater)  # every rank starts from rank 0's parameters and updater state
    sync.load_state(start.sync_numbers, start.sync_arrays)  # e.g. sharing's tau, and its mean residual (rank 0's)
    sync.load_rank_arrays(trainable, updater, start.rank_arrays)  # as many ranks as wrote it: each rank's own state
    if comm.is_root:
        plan = batches.rows.plan
        log.info("%d ranks, global batch %d (%d per rank), %d steps per epoch (%d rows not used per epoch), shuffle "
                 "window %d rows (each chunk read at most %.2f times per epoch), %d parameters%s, sync %s, backend "
                 "%s%s%s", comm.size, plan.global_batch, batches.batch_size, plan.steps, plan.dropped_rows,
                 plan.window_rows, plan.chunk_reads(comm.size), model.n_params,
                 f" ({model.trainable_start} frozen)" if model.trainable_start else "", config.sync.mode,
                 run.backend.name,
                 ", collectives staged through host memory" if comm.staged else "",
                 ", device sums through NCCL" if comm.device_collectives == "nccl" else "")
    metrics = MetricsLog(config.run_dir, comm, batches.steps_per_epoch, config.train.epochs,
                         config.train.straggler_factor)
    schedule = Schedule(config.optimizer, batches.steps_per_epoch, config.train.epochs)
    schedule.load_state(start.loop_state.get("schedule", {}))
    stepper = graphed(config.train.cuda_graph,
                      batch_stepper(config.train.tbptt_steps, model, comm, config.train.accumulate, sync,
                                    batches.batch_size), model, run.backend)
    _warm_up(run, batches, stepper, (config.train.seed, comm.rank, start.epoch, start.step))
    return _Loop(batches, test_rows, updater, sync, metrics, start.epoch, start.step,
                 AllocationTrace(config.train.trace_allocations), stepper, schedule, stopping)


def _warm_up(run: Run, batches: Batches, stepper: Stepper, key: tuple) -> None:
    """The batch's kernels once (`Batches.warm_up`), then one forward and backward of a micro-batch of zeros before
    the first timed step, with the first step's dropout `key`: numba compiles (or loads from its cache) the step's
    kernels, and the workspace takes its arrays, here, so
    the first metrics window's samples/s (and summary.json's) counts training, not compilation. The parameters are
    not touched (no sync step), and the running statistics and gradients are set back: training goes on bit for bit
    as without it. Not a collective."""
    model = run.model
    batches.warm_up()
    x, y = batches.zeros()
    micro = stepper.micro_rows(len(y))
    stats = model.stats.copy()
    model.train_batch(micro_batch(x, slice(0, micro)), y[:micro], key=key)
    model.stats[...] = stats
    model.grads[...] = 0


def _continue_order(run: Run, batches: Batches, start) -> Batches:
    """The batches a resumed run continues with: a checkpoint taken mid-epoch continues that epoch's order, so it
    keeps its window (its global batch and the other keys of the order were checked by `Checkpointer.resume`); at
    an epoch's end the config's apply. The same on every rank (the Position is broadcast)."""
    saved_batch, saved_window = start.order
    plan = batches.rows.plan
    if not start.step or (saved_batch, saved_window) == (plan.global_batch, plan.window_rows):
        return batches
    if not saved_batch:
        if run.comm.is_root:
            log.warning("the checkpoint was written before epoch orders were recorded: epoch %d continues at step %d "
                        "of today's order, so some of its rows may be seen twice and others not at all",
                        start.epoch + 1, start.step)
        return batches
    if run.comm.is_root:
        log.info("the rest of epoch %d keeps its checkpoint's shuffle window of %d rows (data.buffer_mb now gives %d)",
                 start.epoch + 1, saved_window, plan.window_rows)
    return run.train_batches(window=saved_window)


def _train_epochs(run: Run, loop: _Loop, watchdog: Watchdog, stop: StopSignals, on_epoch=None) -> _Done:
    """The epochs from where the run starts, each its steps (`_train_epoch`) then its end (`_end_epoch`), then
    `on_epoch(epoch, record)` when given; until early stopping ends them (at an epoch's end, or after a step)."""
    done, start_step = _Done(), loop.step
    try:
        for epoch in range(loop.epoch, run.config.train.epochs if not loop.stopping.stop else loop.epoch):
            totals = _train_epoch(run, loop, epoch, start_step, watchdog, stop, done)
            if loop.stopping.stop:  # after a step of this epoch: its end does not come
                _count(done, totals, Traffic())
                break
            record = _end_epoch(run, loop, epoch, totals, done, watchdog, stop)
            if on_epoch is not None:
                on_epoch(epoch, record)
            if loop.stopping.stop:
                break
            start_step = 0
    finally:
        loop.metrics.close()  # however the epochs end: a worker trains trial after trial in one process
    return done


def _stop_before_first_step(run: Run, stop: StopSignals) -> None:
    """A signal on any rank from the process's start until now (set-up: dataset, model, resuming, pretraining)
    stops every rank before the first step, with nothing new to save (a collective: one blocking agreement)."""
    signal_name = stop.agree_now()
    if signal_name:
        then = requeue(run.config.train.requeue, signal_name, run.comm.is_root, "it starts again (from the run's "
                       "newest checkpoint, if it has one)")
        raise Stopped(f"stopped by {signal_name} before the first step, nothing to save; {then}")


def _stop_after_last_step(run: Run, stop: StopSignals) -> None:
    """A signal on any rank since the last step's agreement (the final evaluation, the final checkpoint, the
    summary, the report: all of them finished first) stops every rank now, naming what was written (a collective:
    one blocking agreement). Training is complete, so the job is not requeued."""
    signal_name = stop.agree_now()
    if signal_name:
        report = " and the report" if run.config.report else ""
        raise Stopped(f"stopped by {signal_name} after the last step, training complete: the final checkpoint is "
                      f"{_final_checkpoint(run)}; wrote summary.json{report}; nothing left to resume")


def _final_checkpoint(run: Run) -> str:
    """The run's newest checkpoint as rank 0 lists it, on every rank (a collective). Rank 0 alone writes and reads
    the checkpoints; another rank's node may not see them (a run_dir on node-local disk, an NFS client's cached
    listing of checkpoints/), and its own empty listing raised IndexError on it once training was complete."""
    return run.comm.bcast_obj(run.checkpointer.paths()[-1] if run.comm.is_root else None)


def _train_epoch(run: Run, loop: _Loop, epoch: int, start_step: int, watchdog: Watchdog, stop: StopSignals,
                 done: _Done) -> Totals:
    """The steps of `epoch` from `start_step`: each step, then its metrics window when one ends, the stop agreement,
    the checkpoint cadence and early stopping's evaluations by step (the last one's evaluation goes into `done`).
    Returns the epoch's totals on this rank, early when early stopping ends training after a step."""
    comm, grads_ready = run.comm, functools.partial(loop.sync.grads_ready, run.model.trainable)  # backward tells the sync
    loop.metrics.start_epoch(epoch, start_step)
    window, totals = Window(), Totals()
    tick, host_tick = time.perf_counter(), time.thread_time()
    batches = loop.batches.epoch(epoch, start_step)
    try:
        for step in range(start_step, loop.batches.steps_per_epoch):
            run.comm.calls.at(DATA_READ, epoch, step)  # the roll-call's phases (mpitrain/parallel/rollcall.py)
            x, y = _next_batch(loop, batches, stop)
            waited = time.perf_counter() - tick  # for this batch: the prefetch was behind
            watchdog.beat(f"epoch {epoch + 1} step {step + 1}")
            loop.updater.lr = loop.schedule.rate(epoch, step)
            before = Traffic.of(comm)
            loss, correct = _step(run, loop, epoch, step, x, y, grads_ready)
            window.add(step, loss, correct, len(y), time.perf_counter() - tick, Traffic.of(comm) - before, waited,
                       time.thread_time() - host_tick)
            last = step + 1 == loop.batches.steps_per_epoch
            stop_signal = stop.agreed()  # the same answer on every rank, in the same step (a read failure raises)
            if (step + 1) % run.config.train.log_every == 0 or last or stop_signal:
                totals += _record_window(run, loop, epoch, step, window)
                window = Window()
            if stop_signal:
                _stop_with_checkpoint(run, loop, epoch, step, stop_signal, watchdog, stop)
            if not last and loop.stopping.due(epoch, step, loop.batches.steps_per_epoch, epoch_end=False):
                done.evaluation = _evaluate(run, loop)
                _observe(run, loop, done.evaluation, epoch, step + 1, stop)
                if loop.stopping.stop:
                    if (step + 1) % run.config.train.log_every:
                        totals += _record_window(run, loop, epoch, step, window)
                    _save(run, loop, epoch, step + 1, stop)
                    return totals
            if _step_checkpoint_due(run.config, step) and not last:
                _save(run, loop, epoch, step + 1, stop)
            tick, host_tick = time.perf_counter(), time.thread_time()
    finally:
        batches.close()  # ends the prefetch thread
    return totals


def _next_batch(loop: _Loop, batches, stop: StopSignals):
    """The next batch; after this rank failed to read its rows, a stand-in batch of zeros: the failure goes into
    the stop agreement, and the ranks keep stepping together until all of them raise it (`StopSignals.agreed`)."""
    if stop.read_failure is None:
        try:
            return next(batches)
        except DataError as e:
            stop.fail(str(e))
    return loop.batches.zeros()


def _save(run: Run, loop: _Loop, epoch: int, step: int, stop: StopSignals, best: bool = False) -> str:
    """Checkpoint "resume at step `step` of epoch `epoch`" in the run's epoch order (a collective), or with `best`
    the run's best (checkpoints/best.h5); refused on every rank once this or another rank failed to read its rows
    (`stop.read_failure`: it trained on stand-in batches)."""
    plan = loop.batches.rows.plan
    run.comm.calls.at(CHECKPOINT, *((epoch, step - 1) if step else (epoch - 1, -1)))  # after that step, or epoch
    return run.checkpointer.save(epoch, step, run.model, loop.updater, loop.sync, (plan.global_batch, plan.window_rows),
                                 stop.read_failure, loop.state(), best)


def _observe(run: Run, loop: _Loop, evaluation: Evaluation, epoch: int, step: int, stop: StopSignals) -> None:
    """Early stopping counts `evaluation` of the model at "step `step` of epoch `epoch`": a new best is written as
    checkpoints/best.h5 (a collective: every rank decides the same from the same numbers)."""
    metrics = evaluation.figures()
    improved = loop.stopping.observe(metrics, epoch, step)
    if improved:
        _save(run, loop, epoch, step, stop, best=True)
    if run.comm.is_root:
        s = loop.stopping
        log.info("early stopping: %s %s, best %s; %s", s.options.monitor, figure(metrics[s.options.monitor]),
                 figure(s.best), "stopping: no improvement in %d evaluations" % s.waited if s.stop
                 else "a new best" if improved else "%d of %d evaluations without improvement" % (s.waited,
                                                                                                 s.options.patience))


def _step(run: Run, loop: _Loop, epoch: int, step: int, x, y, grads_ready):
    """One training step: forward and backward on this rank's batch, then the synchronizer's step (which
    updates the parameters), or those of each segment (`train.tbptt_steps`). Returns the batch's loss and correct
    count, on the device."""
    run.comm.calls.at(STEP, epoch, step)
    with loop.allocations.span("step"):  # the step itself; its bookkeeping is a few Python objects
        return loop.stepper.step(run.model, x, y, (run.config.train.seed, run.comm.rank, epoch, step), grads_ready,
                                 loop.sync, loop.updater)


def _record_window(run: Run, loop: _Loop, epoch: int, step: int, window: Window) -> Totals:
    """End a metrics window at `step` (a collective: every rank's window goes into one record). Returns its totals."""
    copied = time.perf_counter()
    totals = window.totals(run.backend)  # the window's one device -> host copy ...
    totals.seconds += time.perf_counter() - copied  # ... waits for its queued GPU work
    loop.metrics.window(epoch, step, totals, {"lr": loop.updater.lr, **loop.sync.metrics()})
    return totals


def _stop_with_checkpoint(run: Run, loop: _Loop, epoch: int, step: int, signal_name: str, watchdog: Watchdog,
                          stop: StopSignals):
    """The ranks agreed to stop after `step` (a stop signal on any rank): checkpoint it, requeue the job after
    SIGUSR1 (rank 0), and raise Stopped (exit status 3)."""
    watchdog.beat(f"the checkpoint of {signal_name} at epoch {epoch + 1} step {step + 1}")
    path = _save(run, loop, epoch, step + 1, stop)
    then = requeue(run.config.train.requeue, signal_name, run.comm.is_root)
    raise Stopped(f"stopped by {signal_name} at epoch {epoch + 1} step {step + 1}: wrote {path}; {then}")


def _step_checkpoint_due(config: Config, step: int) -> bool:
    """Whether `checkpoint: {unit: step}` asks for a checkpoint after `step` (0-based) of an epoch."""
    return config.checkpoint.unit == "step" and (step + 1) % config.checkpoint.every == 0


def _epoch_checkpoint_due(config: Config, epoch: int) -> bool:
    """Whether a checkpoint is written at the end of `epoch`: by `checkpoint: {unit: epoch}`, and always the last."""
    return epoch + 1 == config.train.epochs or (config.checkpoint.unit == "epoch"
                                                and (epoch + 1) % config.checkpoint.every == 0)


def _end_epoch(run: Run, loop: _Loop, epoch: int, totals: Totals, done: _Done, watchdog: Watchdog,
               stop: StopSignals) -> dict:
    """The end of `epoch` (collectives): the sync's epoch work, the replica check, an evaluation, the epoch record
    and, by the cadence, a checkpoint; what the epoch did is added to `done`. Returns the epoch record."""
    config, comm, model, sync = run.config, run.comm, run.model, loop.sync
    watchdog.beat(f"the end of epoch {epoch + 1} (sync, replica check, evaluation, checkpoint)")
    before = Traffic.of(comm)
    sync.end_epoch(model.trainable, loop.updater)
    _count(done, totals, Traffic.of(comm) - before)
    if sync.replicas_identical and config.sync.check_replicas:
        done.hashes = check_replicas(comm, *map(run.backend.to_host, (model.params, model.stats)))
    with loop.allocations.span("evaluation"):
        done.evaluation = _evaluate(run, loop)
    loop.schedule.end_epoch(done.evaluation.figures())  # reduce_on_plateau's count, before the checkpoint keeps it
    if loop.stopping.due(epoch, loop.batches.steps_per_epoch - 1, loop.batches.steps_per_epoch, epoch_end=True):
        _observe(run, loop, done.evaluation, epoch + 1, 0, stop)
    record = {"epoch": epoch, "nodes": comm.nodes, "ranks_per_node": comm.local_size,
              "train_loss": totals.loss_sum / max(totals.samples, 1),
              "test_accuracy": done.evaluation.accuracy, "test_loss": done.evaluation.loss,
              "replica_hashes": done.hashes}
    loop.metrics.end_epoch(record)
    if _epoch_checkpoint_due(config, epoch) or loop.stopping.stop:
        _save(run, loop, epoch + 1, 0, stop)  # the end of training is always kept
    return record


def _count(done: _Done, totals: Totals, end_traffic: Traffic) -> None:
    """Add an epoch's (or its steps') totals to what the epochs did, with the traffic of its end."""
    done.traffic += totals.traffic + end_traffic
    done.seconds += totals.seconds
    done.samples += totals.samples
    done.steps += totals.steps
    done.input_seconds += totals.input_seconds
    done.host_seconds += totals.host_seconds


def _evaluate(run: Run, loop: _Loop) -> Evaluation:
    run.comm.calls.at(EVALUATION)
    manifest = run.reader.manifest
    return evaluate(run.model, loop.test_rows, loop.batches.to_model_input, EVAL_BATCH_SIZE, run.comm,
                    manifest.num_classes, run.backend, run.target)


def _finish(run: Run, loop: _Loop, done: _Done, started: float) -> dict:
    """The summary over all ranks (a collective); rank 0 writes summary.json and the report."""
    config, comm, model, backend = run.config, run.comm, run.model, run.backend
    evaluation = done.evaluation or _evaluate(run, loop)  # resumed a finished run: evaluate what it left
    comm.calls.at(SUMMARY)
    slowest = comm.max(done.seconds)
    summary = {
        "test_accuracy": evaluation.accuracy, "test_loss": evaluation.loss,
        "samples_per_s": sum(comm.allgather_obj(done.samples)) / slowest if slowest else 0.0,
        **per_step(comm.allgather_obj(done.traffic), done.steps),  # the ranks' mean
        "input_wait_ms_per_step": mean_ms_per_step(comm.allgather_obj(done.input_seconds), done.steps),
        "host_cpu_ms_per_step": mean_ms_per_step(comm.allgather_obj(done.host_seconds), done.steps),
        **_reading(comm, loop.batches, done.steps),
        "peak_rss_mb": comm.max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),  # VmHWM, the largest rank
        "comm_ms_per_step": loop.metrics.comm_ms_per_step,
        "steps_this_job": done.steps,  # 0: a later job that wrote the missing records (its figures are 0)
        "final_checkpoint": os.path.basename(_final_checkpoint(run)),  # what it describes (_summary_is_current)
        "epochs": config.train.epochs, "ranks": comm.size, "nodes": comm.nodes,
        "ranks_per_node": comm.local_size, "sync_mode": config.sync.mode,
        "wall_s": comm.max(time.perf_counter() - started), "steps_per_epoch": loop.batches.steps_per_epoch,
        "n_params": model.n_params, "n_trainable": model.trainable.n_params,
        "replica_hashes": comm.allgather_obj(parameter_hash(*map(backend.to_host, (model.params, model.stats)))),
        "backend": backend.name, "cuda_aware_mpi": comm.cuda_aware, "host_staging": comm.staged,
        "device_collectives": comm.device_collectives,
        "cuda_graphs": len(getattr(loop.stepper, "captured", ())),  # batch shapes whose steps replay a graph
        "transfers": backend.transfers.to_dict(),
        "evaluation": evaluation.to_dict(),
        **loop.sync.summary(),  # the mode's own (auto's choices)
    }
    if loop.metrics.stragglers is not None and loop.metrics.stragglers.named:  # mpitrain/training/stragglers.py
        summary["stragglers"] = loop.metrics.stragglers.named
    if loop.stopping.on:  # why training ended, where, and which checkpoint eval, predict and export take
        summary["early_stopping"] = {**loop.stopping.summary(), "best_checkpoint": RunDir(config.run_dir).best_checkpoint}
    if config.train.trace_allocations:  # the largest over the ranks, per span kind
        summary["allocated_bytes"] = {kind: max(worst.get(kind, 0) for worst in comm.allgather_obj(
            loop.allocations.worst())) for kind in ("step", "evaluation")}
    with comm.agreed_errors():
        if comm.is_root:
            _write_summary(run, summary)
            log.info("test accuracy %s, %.0f samples/s, %.0f bytes sent per step per rank",
                     figure(summary["test_accuracy"]), summary["samples_per_s"], summary["bytes_sent_per_step"])
            if config.report:
                _draw_report(run)
    return summary


def _write_summary(run: Run, summary: dict) -> None:
    """(Rank 0) summary.json, the run's last required record, before anything optional. Training is complete by
    now: a failure says what is saved and what is not, and how to finish the records without training."""
    missing = "summary.json and the report" if run.config.report else "summary.json"
    with _records_missing(run, missing):
        write_file(RunDir(run.config.run_dir).summary, lambda f: json.dump(summary, f, indent=2))


def _draw_report(run: Run) -> None:
    """(Rank 0) report.png and report.html from the run's records, each whole or absent."""
    from mpitrain.rundir.report import write_report
    with _records_missing(run, "the report", also_saved=" and summary.json"):
        with os_errors(run.config.run_dir, "drawing the report"):
            log.info("wrote %s and %s", *write_report([run.config.run_dir], run.config.run_dir, overwrite=True))


@contextlib.contextmanager
def _records_missing(run: Run, missing: str, also_saved: str = ""):
    """A failure to write a record after the last step (a full disk, a read-only folder) as one line that says what
    is saved (training's final checkpoint, `also_saved`) and what is not (`missing`), and that `mpitrain train` on
    the run again writes only the missing records, without training (`_set_up_training` finds the run finished)."""
    try:
        yield
    except MpitrainError as e:
        saved = f"its final checkpoint {run.checkpointer.paths()[-1]}{also_saved} {'are' if also_saved else 'is'}"
        raise MpitrainError(f"{e}; training is complete and {saved} saved, {missing} not; once the cause is fixed, "
                            f"`mpitrain train` on this run again writes {missing} without training") from None


def _reading(comm, batches: Batches, steps: int) -> dict:
    """What training read from storage, all ranks together (a collective): stored bytes of the chunks, bytes a remote
    store sent (0 for a folder), and the rows of the chunks read per epoch trained in this job over the split's rows
    (1.0: each row read once per epoch)."""
    shards, plan = batches.rows.shards, batches.rows.plan
    rows, stored, fetched = np.sum(comm.allgather_obj((shards.rows_read, shards.bytes_read, shards.bytes_fetched)),
                                   axis=0)
    epochs = steps / plan.steps if plan.steps else 0.0
    return {"data_bytes_read": int(stored), "data_bytes_fetched": int(fetched),
            "data_read_per_epoch": float(rows / (plan.blocks.total_rows * epochs)) if epochs else 0.0}


def _summary_is_current(run: Run) -> bool:
    """(Rank 0) Whether summary.json describes the run's newest checkpoint: not when it is missing or unreadable,
    nor when it is an earlier end's (a job that trained on from it, then failed before its own summary). A summary
    written before summaries named their checkpoint counts as current."""
    try:
        with open(RunDir(run.config.run_dir).summary) as f:
            described = json.load(f).get("final_checkpoint")
    except (OSError, ValueError, AttributeError):
        return False
    newest = run.checkpointer.paths()
    return described is None or (bool(newest) and described == os.path.basename(newest[-1]))


def _summary_of_finished_run(run: Run) -> dict:
    """A finished run asked to train again trains nothing: the summary it wrote, on every rank (a collective); and
    the report, drawn only when it is asked for and missing (the job that trained failed on it)."""
    files = RunDir(run.config.run_dir)
    with run.comm.agreed_errors():
        if run.comm.is_root and run.config.report and not all(map(os.path.exists, (files.report_png,
                                                                                   files.report_html))):
            log.info("%s is finished but has no report: drawing it, without training", run.config.run_dir)
            _draw_report(run)
    summary = None
    if run.comm.is_root:
        with open(RunDir(run.config.run_dir).summary) as f:
            summary = json.load(f)
    return run.comm.bcast_obj(summary)
