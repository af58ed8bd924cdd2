"""The dense synchronization modes: none, allreduce (gradients), averaging (parameters)."""
from __future__ import annotations

import typing
from dataclasses import dataclass

from mpitrain.base.options import ALLOWED, Options, check_value, option
from mpitrain.parallel.sync.base import Synchronizer, apply_update
from mpitrain.parallel.sync.buckets import gradient_buckets
from mpitrain.parallel.sync.compression import COMPRESSIONS, PostedMean, compressed_mean_
from mpitrain.parallel.sync.powersgd import PowerSGD
from mpitrain.parallel.sync.sparse import average_table_rows, exchange_tables


@dataclass(frozen=True)
class AllreduceOptions(Options):
    """The keys of `sync` that `allreduce` reads (beside every mode's: `mpitrain.config.sections.SyncConfig`)."""

    ON_RESUME = ALLOWED

    overlap: bool = option(True, "allreduce: post a non-blocking Allreduce on each bucket of gradients as backward "
                                 "finishes it, driving MPI between layers; the last bucket (done when backward "
                                 "ends) by a blocking Allreduce, then wait for all before the update; false: one "
                                 "blocking Allreduce after backward. The results are the same.")
    bucket_mb: float = option(1.0, "allreduce with overlap: the largest bucket, in MB (1e6 bytes); whole layers, "
                                   "last layer first; a layer larger than this is a bucket of its own, 0 gives one "
                                   "bucket per layer. The default was chosen on the simulated cluster "
                                   "(docs/cluster.md, benchmarks/cluster.py's bucket rows).", domain="[0, 1e6]")


@dataclass(frozen=True)
class AveragingOptions(Options):
    """The keys of `sync` that `averaging` reads (beside every mode's)."""

    ON_RESUME = ALLOWED

    frequency: typing.Union[int, str] = option(1, "averaging: steps between averagings, or 'epoch'.", domain="[1, 1e9]")
    average_updater: bool = option(False, "averaging: average the updater state too (DL4J's "
                                          "ParameterAveragingTrainingMaster).")

    def validate(self, where, prefix):
        self.check_domains(where, prefix)
        check_value(self.frequency == "epoch" or isinstance(self.frequency, int), where, f"{prefix}frequency",
                    self.frequency, "a number of steps, or 'epoch'")
        return self


class NoSync(Synchronizer):
    """Each rank trains alone: single-process runs and independent baselines."""

    replicas_identical = False
    rank_local = ("params", "stats", "updater_state")  # every rank its own model

    def step(self, model, updater) -> None:
        apply_update(model, updater)

    def merged(self, name: str, array):
        """Rank 0's own: independent models have no mean worth keeping. A collective that sends nothing."""
        return array


class AllreduceSync(Synchronizer):
    """Synchronous SGD: average the flat gradient buffer every step, then an identical update everywhere.

    With `overlap` (the default) the buffer is cut into buckets of whole layers, last layer first
    (`mpitrain.parallel.sync.buckets`, at most `bucket_mb` each); as backward finishes a bucket the rank
    posts a non-blocking Allreduce on it and lets MPI progress after every layer. The last bucket
    (the first layers, done when backward ends) nothing could hide anyway: `step` reduces it by a
    blocking Allreduce, which moves the posted ones along (and measured faster than a posted one on
    MPICH), then waits for them all before the update. A one-bucket cut is thus exactly blocking
    `allreduce`. Every rank posts the same buckets in the same order. Sums are elementwise, so
    they do not depend on the cut: at 2 ranks the result is bit for bit that of one blocking
    Allreduce (beyond, MPI may add in another order: equal to float rounding).

    A model's embedding tables (`model.sparse_tables`, the buffer before `model.dense_start`) go
    after the dense part, by the rows each rank touched (`mpitrain.parallel.sync.sparse`).

    With `sync.compression` (bf16, fp16) the dense gradients go 16 bits on the wire
    (`mpitrain.parallel.sync.compression.PostedMean`: an Ialltoallv of each rank's chunks to their owners, a
    float32 sum per chunk, an Allgatherv of the owners' means); with `overlap` each bucket's Ialltoallv is posted
    as backward finishes it (every bucket: no uncompressed last one), and `step` waits for them all and finishes
    them in order. Every rank decodes the same means, so replicas stay identical. `powersgd` factors each weight
    matrix's gradient (`mpitrain.parallel.sync.powersgd`): each bucket's first Allreduce (its P's and vectors) is
    posted likewise, the rest after backward; its warm start and this rank's error are the mode's checkpoint
    state.
    """

    Options = AllreduceOptions

    rank_local = ("stats", "sync/powersgd_error")  # under powersgd: each rank's error feedback

    def reset(self) -> None:
        self.codec = COMPRESSIONS[self.config.compression]() if self.config.compression in COMPRESSIONS else None
        self.power = None

    def state(self) -> dict:
        """Under powersgd: the Q of every matrix (the same on every rank) and this rank's error."""
        return {"powersgd_q": self.power.q, "powersgd_error": self.power.error} if self.power else {}

    def start(self, model, updater) -> None:
        super().start(model, updater)
        if self.config.compression == "powersgd":
            self.power = PowerSGD(model.layout[len(model.sparse_tables):], self.config.powersgd_rank, model.xp,
                                  model.grads.dtype)
        dense = model.dense_start
        self.buckets = [(begin + dense, end + dense) for begin, end in
                        gradient_buckets(model.layout[len(model.sparse_tables):], self.options.bucket_mb * 1e6,
                                         model.grads.itemsize)]
        self.posted, self.means = [], []  # posted collectives; under compression their buckets' PostedMean

    def grads_ready(self, model, start: int) -> None:
        if self.options.overlap:
            self._post(model, start)
            self.comm.progress(self.posted)

    def step(self, model, updater) -> None:
        if self.power or self.codec:
            if self.options.overlap:
                self._post(model, 0)
            else:
                self.posted.append(self._post_compressed(model, model.dense_start, model.grads.size))
            self.comm.complete(self.posted)
            if self.power:
                self.power.finish(self.comm, model.grads[model.dense_start:])
            for mean in self.means:  # in order: their Allgathervs are collectives
                mean.finish()
            self.posted, self.means = [], []
        elif self.options.overlap:
            self._post(model, 0)  # what backward did not announce (a model without the hook: all of it)
            begin, end = self.buckets[-1]
            self.comm.complete(self.posted, last=model.grads[begin:end])
            self.posted = []
            model.grads[model.dense_start:] /= self.comm.size
        else:
            self.comm.average_(model.grads[model.dense_start:])
        exchange_tables(self.comm, model, dense=self.config.embeddings == "dense")
        apply_update(model, updater)

    def _post(self, model, start: int) -> None:
        """Post the next buckets but the last (under compression every one), in order, while they lie within the
        final `grads[start:]`. A collective."""
        compressed = self.codec or self.power
        posts = len(self.buckets) - (0 if compressed else 1)
        while len(self.posted) < posts and self.buckets[len(self.posted)][0] >= start:
            begin, end = self.buckets[len(self.posted)]
            self.posted.append(self._post_compressed(model, begin, end) if compressed else
                               self.comm.iallreduce_(model.grads[begin:end]))

    def _post_compressed(self, model, begin: int, end: int):
        """Post `grads[begin:end]`'s compressed exchange (powersgd's first Allreduce, or a codec's Ialltoallv); its
        `Posted`. A collective."""
        if self.power:
            dense = model.dense_start
            return self.power.post(self.comm, model.grads[dense:], begin - dense, end - dense)
        self.means.append(PostedMean(self.comm, model.grads[begin:end], self.codec))
        return self.means[-1].posted


class AveragingSync(Synchronizer):
    """Local steps; every `frequency` steps (or once per epoch) average the parameters.

    With `average_updater`, the flat updater state is averaged too (DL4J's
    ParameterAveragingTrainingMaster); running statistics always are. An epoch always ends with an averaging, so the
    replicas are identical at every epoch end, whatever the frequency. Between averagings each rank's parameters,
    statistics and updater state are its own (`rank_local`); the updater state stays so after an averaging
    without `average_updater`.

    A model's embedding tables (`model.sparse_tables`) are averaged by the rows any rank changed since the last
    averaging (`mpitrain.parallel.sync.sparse.average_table_rows`) when only the touched rows change: an updater
    without state (plain SGD; tables get no L2). Under momentum or Adam every row moves each step, so the tables
    are averaged whole, as after a resume (each rank's own parameters) and with `embeddings: dense`.

    With `sync.compression` each rank sends its dense parameters' change since the last averaging, compressed
    (bf16, fp16: `mpitrain.parallel.sync.compression.compressed_mean_`; powersgd: `mpitrain.parallel.sync.powersgd`,
    the error fed back into the next interval's change), and every rank adds the ranks' mean change to that
    `reference` (the same on every rank, kept in checkpoints): parameters are never rounded, only the changes of
    one averaging interval. Running statistics and the updater state go exact.
    """

    Options = AveragingOptions
    rank_local = ("params", "stats", "updater_state", "sync/powersgd_error")
    state_names = ("steps_since_average",)

    def reset(self) -> None:
        self.steps_since_average = 0
        self.codec = COMPRESSIONS[self.config.compression]() if self.config.compression in COMPRESSIONS else None
        self.power = self.reference = None

    def state(self) -> dict:
        """Beside the steps since the last averaging, under compression the `reference` the changes start from (and
        powersgd's Q and this rank's error)."""
        return {**super().state(), **({"reference": self.reference} if self.reference is not None else {}),
                **({"powersgd_q": self.power.q, "powersgd_error": self.power.error} if self.power else {})}

    def start(self, model, updater) -> None:
        super().start(model, updater)
        if self.config.compression != "none":
            self.reference = model.params[model.dense_start:].copy()  # identical: broadcast
        if self.config.compression == "powersgd":
            self.power = PowerSGD(model.layout[len(model.sparse_tables):], self.config.powersgd_rank, model.xp,
                                  model.params.dtype)
        self.changed = [None] * len(model.sparse_tables)  # rows changed since the last averaging; None: any
        self.track_rows = updater.steps_rows_alone and self.config.embeddings != "dense"

    def step(self, model, updater) -> None:
        apply_update(model, updater)
        if self.track_rows:
            self.changed = [None if rows is None else model.xp.union1d(rows, table.touched)
                            for rows, table in zip(self.changed, model.sparse_tables)]
        self.steps_since_average += 1
        if self.options.frequency != "epoch" and self.steps_since_average >= self.options.frequency:
            self._average(model, updater)

    def _end_epoch(self, model, updater) -> None:
        if self.steps_since_average:
            self._average(model, updater)

    def _average(self, model, updater) -> None:
        if self.reference is not None:
            dense = model.params[model.dense_start:]
            change = dense - self.reference
            if self.power:
                self.power.mean_(self.comm, change)
            else:
                compressed_mean_(self.comm, change, self.codec)
            dense[...] = self.reference + change  # every rank the same: the reference and the decoded means are
            self.reference[...] = dense
        else:
            self.comm.average_(model.params[model.dense_start:])
        if model.sparse_tables:
            average_table_rows(self.comm, model, self.changed)
            empty = model.xp.zeros(0, model.xp.int64)
            self.changed = [empty if self.track_rows else None for _ in model.sparse_tables]
        self.average_stats(model)
        if self.options.average_updater and updater.state.size:
            self.comm.average_(updater.state)
        self.steps_since_average = 0
