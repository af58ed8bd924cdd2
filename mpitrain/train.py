"""The training loop, as the story of a run: config, data, model, sync, epochs, summary, report."""
from __future__ import annotations

import json
import logging
import os
import time

import yaml

from mpitrain.backend import create_backend
from mpitrain.checkpoint import (Checkpoint, check_fits, list_checkpoints, load_checkpoint, restore_model,
                                 save_checkpoint)
from mpitrain.config import Config, save_config
from mpitrain.data import Batches, load_rank_rows
from mpitrain.errors import ConfigError, MpitrainError
from mpitrain.evaluate import evaluate
from mpitrain.metrics import MetricsLog, Totals, Traffic, Window, per_step
from mpitrain.nn.model import build_model
from mpitrain.nn.updaters import create_updater
from mpitrain.pretrain import dbn_layers, pretrain
from mpitrain.shard_format import MANIFEST_NAME, read_manifest, sha256_file
from mpitrain.sync import check_replicas, create_synchronizer, parameter_hash
from mpitrain.watchdog import Watchdog

log = logging.getLogger("mpitrain")


def train(config: Config, comm) -> dict:
    """Train as `config` says on every rank of `comm`; rank 0 writes the run directory. Returns the summary."""
    started = time.perf_counter()
    backend = create_backend(config.backend, comm.local_rank, comm.local_size)  # before any allocation
    comm.use_backend(backend, config.comm.cuda_aware)
    with comm.agreed_errors():
        manifest = read_manifest(config.data.path)
        if config.pretrain.layers and not config.model.layers:
            config.model.layers = dbn_layers(config.pretrain.layers, manifest.num_classes)
        model = build_model(config.model, manifest.feature_shape, manifest.num_classes, backend.xp)
        train_rows = load_rank_rows(config.data.path, manifest, config.data.train_split, comm.rank, comm.size,
                                    training=True, max_rows=config.data.max_rows,
                                    verify_checksums=config.data.verify_checksums)
        test_rows = load_rank_rows(config.data.path, manifest, config.data.test_split, comm.rank, comm.size,
                                   training=False, max_rows=config.data.max_rows,
                                   verify_checksums=config.data.verify_checksums)
        manifest_sha256 = sha256_file(os.path.join(config.data.path, MANIFEST_NAME))
        if config.data.augment and len(manifest.feature_shape) != 3:
            raise ConfigError(f"data.augment flips and shifts images, but {config.data.path} holds rows of "
                              f"shape {tuple(manifest.feature_shape)}; expected images (channels, height, width)")
        if len(train_rows.y) < config.train.batch_size:
            raise ConfigError(f"train.batch_size is {config.train.batch_size} (per rank), but each of the "
                              f"{comm.size} ranks has only {len(train_rows.y)} training rows")
    batches = Batches(train_rows, manifest, config.train.batch_size, backend, config.model.dtype,
                      config.train.seed, comm.rank, shuffle=config.data.shuffle,
                      normalize=config.data.normalize, prefetch=config.data.prefetch,
                      augment=config.data.augment)
    updater = create_updater(config.optimizer, model.params, model.decay_mask)
    sync = create_synchronizer(config.sync, comm)

    model.init_params(config.train.seed, config.model.init)
    epoch, start_step, sync_state, sync_buffers = _resume(config, comm, backend, model, updater, manifest_sha256)
    if comm.is_root:
        os.makedirs(config.run_dir, exist_ok=True)
        save_config(config, os.path.join(config.run_dir, "config.yaml"))
    if config.pretrain.layers and (epoch, start_step) == (0, 0):  # fine-tuning has not begun
        pretrain(config, comm, model, batches, train_rows, manifest_sha256)
    sync.start(model, updater)  # every rank starts from rank 0's parameters and updater state
    sync.load_state(sync_state)
    sync.load_buffers(sync_buffers)  # e.g. sharing's residual, saved by rank 0
    save = Saver(config, comm, backend, sync, model, updater, manifest_sha256)
    metrics = MetricsLog(config.run_dir, comm, batches.steps_per_epoch, config.train.epochs)
    metrics.resume_at(epoch, start_step)
    if comm.is_root:
        log.info("%d ranks, %d training rows per rank, %d steps per epoch, %d parameters, sync %s, backend %s%s",
                 comm.size, len(train_rows.y), batches.steps_per_epoch, model.n_params, config.sync.mode,
                 backend.name, ", collectives staged through host memory" if comm.staging else "")

    train_seconds, train_samples, sync_traffic, steps_done = 0.0, 0, Traffic(), 0
    evaluation, hashes = None, []
    with Watchdog(config.train.watchdog_s, comm.rank, comm.abort) as watchdog:
        for epoch in range(epoch, config.train.epochs):
            metrics.start_epoch(epoch, start_step)
            updater.start_epoch(epoch)
            window, epoch_totals = Window(), Totals()
            tick = time.perf_counter()
            for step, (x, y) in enumerate(batches.epoch(epoch, start_step), start=start_step):
                watchdog.beat(f"epoch {epoch + 1} step {step + 1}")
                loss, correct = model.train_batch(x, y, key=(config.train.seed, comm.rank, epoch, step))
                before = Traffic.of(comm)
                sync.step(model, updater)
                now = time.perf_counter()
                window.add(step, loss, correct, len(y), now - tick, Traffic.of(comm) - before)
                last = step + 1 == batches.steps_per_epoch
                if (step + 1) % config.train.log_every == 0 or last:
                    waited = time.perf_counter()
                    totals = window.totals(backend)  # the window's one device -> host copy ...
                    totals.seconds += time.perf_counter() - waited  # ... waits for its queued GPU work
                    metrics.window(epoch, step, totals, sync.stats())
                    epoch_totals += totals
                    window = Window()
                if config.checkpoint.unit == "step" and (step + 1) % config.checkpoint.every == 0 and not last:
                    save(epoch, step + 1)
                tick = time.perf_counter()
            watchdog.beat(f"the end of epoch {epoch + 1} (sync, replica check, evaluation, checkpoint)")
            before = Traffic.of(comm)
            sync.end_epoch(model, updater)
            sync_traffic += epoch_totals.traffic + (Traffic.of(comm) - before)
            train_seconds += epoch_totals.seconds
            train_samples += epoch_totals.samples
            steps_done += epoch_totals.steps
            if sync.replicas_identical and config.sync.check_replicas:
                hashes = check_replicas(comm, *map(backend.to_host, (model.params, model.stats)))
            evaluation = evaluate(model, test_rows, batches.to_model_input, 256, comm, manifest.num_classes, backend)
            metrics.end_epoch({"epoch": epoch, "train_loss": epoch_totals.loss_sum / max(epoch_totals.samples, 1),
                               "test_accuracy": evaluation.accuracy, "test_loss": evaluation.loss,
                               "replica_hashes": hashes})
            if epoch + 1 == config.train.epochs or (config.checkpoint.unit == "epoch"
                                                    and (epoch + 1) % config.checkpoint.every == 0):
                save(epoch + 1, 0)  # the end of training is always kept
            start_step = 0

    if evaluation is None:  # resumed a finished run: evaluate what it left
        evaluation = evaluate(model, test_rows, batches.to_model_input, 256, comm, manifest.num_classes, backend)
    slowest = comm.max(train_seconds)
    summary = {
        "test_accuracy": evaluation.accuracy, "test_loss": evaluation.loss,
        "samples_per_s": sum(comm.allgather_obj(train_samples)) / slowest if slowest else 0.0,
        **per_step([sync_traffic], steps_done),
        "epochs": config.train.epochs, "ranks": comm.size, "sync_mode": config.sync.mode,
        "wall_s": comm.max(time.perf_counter() - started), "steps_per_epoch": batches.steps_per_epoch,
        "n_params": model.n_params,
        "replica_hashes": comm.allgather_obj(parameter_hash(*map(backend.to_host, (model.params, model.stats)))),
        "backend": backend.name, "cuda_aware_mpi": comm.cuda_aware, "host_staging": comm.staging is not None,
        "transfers": backend.transfers.to_dict(),
        "evaluation": evaluation.to_dict(),
    }
    if comm.is_root:
        with open(os.path.join(config.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        log.info("test accuracy %.4f, %.0f samples/s, %.0f bytes sent per step per rank",
                 summary["test_accuracy"], summary["samples_per_s"], summary["bytes_sent_per_step"])
        if config.report:
            from mpitrain.report import write_report
            log.info("wrote %s and %s", *write_report([config.run_dir], config.run_dir))
    return summary


class Saver:
    """Writes checkpoints: a collective (flush, finiteness check), then rank 0 writes the file."""

    def __init__(self, config, comm, backend, sync, model, updater, manifest_sha256: str):
        self.config, self.comm, self.sync, self.model, self.updater = config, comm, sync, model, updater
        self.backend = backend
        self.manifest_sha256 = manifest_sha256
        self.config_yaml = yaml.safe_dump(config.to_dict(), sort_keys=False)

    def __call__(self, epoch: int, step: int) -> None:
        """Checkpoint "resume at step `step` of epoch `epoch`"; never one with NaN or Inf parameters."""
        model, updater, to_host = self.model, self.updater, self.backend.to_host
        self.sync.flush(model, updater)
        finite = self.comm.allgather_obj(bool(to_host(model.xp.isfinite(model.params).all())))
        if not all(finite):
            raise MpitrainError(f"parameters hold NaN or Inf on rank {finite.index(False)} before the checkpoint "
                                f"of epoch {epoch} step {step}; it is not written, the last good one is kept; "
                                "try a lower optimizer.lr")
        if self.comm.is_root:
            save_checkpoint(self.config.run_dir, Checkpoint(
                to_host(model.params), to_host(updater.state), epoch, step, updater.iteration, model.layout,
                self.sync.state(), self.manifest_sha256, self.config_yaml, stats=to_host(model.stats),
                stats_layout=model.stats_layout, sync_buffers={name: to_host(array) for name, array in
                                                               self.sync.buffers().items()}),
                self.config.checkpoint.keep)


def _resume(config, comm, backend, model, updater, manifest_sha256: str) -> tuple[int, int, dict, dict]:
    """Load the newest checkpoint on rank 0; return (epoch, step, synchronizer state) to continue from,
    and the synchronizer's arrays (rank 0's; empty on the others).

    `resume: never` refuses a run directory that already holds checkpoints rather than
    overwrite them; a fresh start begins a fresh metrics.jsonl. A checkpoint of another
    model, optimizer or dataset is refused, saying what differs.
    """
    position, sync_buffers = (0, 0, 0, {}), {}
    with comm.agreed_errors():
        checkpoints = list_checkpoints(config.run_dir) if comm.is_root else []
        if checkpoints and config.resume == "never":
            raise ConfigError(f"resume is 'never', but {config.run_dir} holds checkpoints of an earlier run; "
                              "use resume=auto to continue it, or another run_dir")
        if checkpoints:
            ckpt = load_checkpoint(checkpoints[-1])
            check_fits(ckpt, model.layout + model.stats_layout, updater.state.size, manifest_sha256,
                       config.data.path)
            restore_model(ckpt, model, backend.to_device)
            updater.state[...] = backend.to_device(ckpt.updater_state)
            position, sync_buffers = (ckpt.epoch, ckpt.step, ckpt.iteration, ckpt.sync_state), ckpt.sync_buffers
            log.info("resuming from %s at epoch %d step %d", ckpt.path, ckpt.epoch + 1, ckpt.step)
        elif comm.is_root and os.path.exists(os.path.join(config.run_dir, "metrics.jsonl")) \
                and not config.pretrain.layers:  # pretraining keeps the records of the layers it skips
            os.remove(os.path.join(config.run_dir, "metrics.jsonl"))
    epoch, step, updater.iteration, sync_state = comm.bcast_obj(position)
    return epoch, step, sync_state, sync_buffers
