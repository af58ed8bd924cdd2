"""`sync.mode: auto`: the least lossy way to keep one model whose communication hides within the step's compute,
chosen by measurement at every epoch's end.

    choice = choose(expected_step_ms)    # the first of CHOICES whose step is within SLACK of the fastest expected

The candidates, from the least lossy (`CHOICES`): `dense` (allreduce of float32 gradients), `bf16` (allreduce,
16 bits on the wire), `sharing` (threshold-encoded updates), `powersgd` (allreduce of rank-`powersgd_rank` factors)
and `averaging` (parameters every `frequency` steps). The order of sharing and powersgd is measured: after 5 epochs on
4 simulated nodes sharing was 0.3 (MLP) and 1.2 (LeNet) points of test accuracy below dense, powersgd of rank 1 5.6
and 1.7 (benchmarks/compression.py; PyTorch's hook runs 1,000 dense steps before it compresses, this one compresses
from the first).

What a mode costs is the whole step it makes, from one step's end to the next's (its codec's encoding during
backward and its work inside the step count; the epoch's first step is left out: it pays for what MPI sets up at
its first collectives), the slowest rank's mean. A mode whose communication hides within compute makes a step as
short as any mode's; so the choice is the first of CHOICES whose expected step is within SLACK of the fastest
expected step, and a lossier mode is taken only where it is expected to be more than SLACK faster. A mode that has
run is expected to make the step its latest epoch measured. One that has not is expected to make the step without
communication (the longest step less its time inside MPI that any mode measured: a codec's own work is not
predicted, so an untried one is taken to cost as much as the costliest measured) plus its communication as the
cost model predicts it (`predicted_ms`, on the link the ranks measure at each epoch's end: blocking Allreduces of a
small and a large buffer, `measure_network`), times the largest ratio of measured to predicted communication seen
(`calibration`, at least 1): the predictions leave out MPI's own costs and the ranks' waits for each other, so they
run low, and the lossier an untried mode, the less it gets the benefit of the doubt. The first epoch runs `dense`,
since no step has been measured yet.

A choice holds for a whole epoch (replicas are identical at every epoch's end in each mode, so the next mode starts
from the same model everywhere: its `start` broadcasts rank 0's). Each choice is logged beside what the epoch before
measured, and recorded in summary.json (`sync_auto`); the choice in force is checkpoint state, so a resume goes on
with it. Every rank decides from the same agreed figures, so every rank chooses alike.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from mpitrain.parallel.costmodel import Network, allgather_exchange
from mpitrain.parallel.sync.base import Synchronizer
from mpitrain.parallel.sync.modes import AllreduceSync, AveragingSync
from mpitrain.parallel.sync.powersgd import allreduce_bytes
from mpitrain.parallel.sync.sharing import ADAPTIVE_DEFAULTS, SharingSync

log = logging.getLogger("mpitrain")

# name: (mode class, the SyncConfig keys it runs with), from the least lossy
CHOICES = {"dense": (AllreduceSync, {"mode": "allreduce", "compression": "none"}),
           "bf16": (AllreduceSync, {"mode": "allreduce", "compression": "bf16"}),
           "sharing": (SharingSync, {"mode": "sharing"}),
           "powersgd": (AllreduceSync, {"mode": "allreduce", "compression": "powersgd"}),
           "averaging": (AveragingSync, {"mode": "averaging", "compression": "none"})}
#: a checkpoint's `auto_choice` is an index into this tuple (the order checkpoints have written since auto began)
CHECKPOINT_CODES = ("dense", "bf16", "powersgd", "sharing", "averaging")
MEASURED = "auto_measured_"  # a checkpoint number's prefix: the step a mode made when it last ran, ms
SMALL, LARGE = 4096, 1 << 18  # bytes of the link's probes (at least: LARGE grows to the gradient's size)
PROBES = 3  # Allreduces of each size; the fastest counts
SLACK = 0.10  # a lossier mode must be expected this much faster per step than a less lossy one to be chosen
#: checkpoint numbers beside the measured steps: the step without communication, and the calibration
FREE, CALIBRATION = "auto_free_ms", "auto_calibration"


def choose(expected_step_ms: dict[str, float]) -> str:
    """The first of CHOICES whose expected step is within SLACK of the fastest expected step."""
    fastest = min(expected_step_ms.values())
    return next(name for name in CHOICES if expected_step_ms[name] <= (1 + SLACK) * fastest)


def measure_network(comm, nbytes: int, xp) -> Network:
    """The link as this job's ranks see it: the fastest of PROBES blocking Allreduces of SMALL and of `nbytes` (at
    least LARGE) bytes, the slowest rank's times (`fitted`). A collective."""
    times = []
    for size in (SMALL, max(nbytes, LARGE)):
        buf = xp.zeros(size // 4, np.float32)
        best = float("inf")
        for _ in range(PROBES):
            comm.barrier()
            start = time.perf_counter()
            comm.allreduce_(buf)
            best = min(best, time.perf_counter() - start)
        times.append((size, comm.max(best)))
    return fitted(times, comm.size)


def fitted(times: list[tuple[int, float]], ranks: int) -> Network:
    """The network of two timed Allreduces [(small bytes, seconds), (large bytes, seconds)] on `ranks` ranks: the
    latency per step and time per byte that the model's own Allreduce formula needs to take both times (the two
    equations solved; neither below 0)."""
    steps, wire = Network(1.0, 0.0), Network(0.0, 1.0)
    system = np.array([[steps.allreduce(size, ranks), wire.allreduce(size, ranks)] for size, _ in times])
    latency, byte_s = np.linalg.lstsq(system, np.array([seconds for _, seconds in times]), rcond=None)[0]
    return Network(max(float(latency), 0.0), max(float(byte_s), 0.0))


class AutoSync(Synchronizer):
    """One of CHOICES' modes at a time, chosen at every epoch's end (see the module docstring); what the trainer
    asks of a mode goes to it."""

    def reset(self) -> None:
        self.choice, self.records, self.measured = "dense", [], {}  # measured: ms per step of each mode that ran
        self.free_ms, self.calibration = 0.0, 1.0  # the step without communication; measured / predicted
        self.inner = self._mode("dense")
        self._new_epoch()

    def _new_epoch(self) -> None:
        """The epoch's measures from zero, taken from one step's end to the next's (the epoch's first step is left
        out: it pays for what MPI sets up at its first collectives): the whole step, the compute between the steps,
        and of each step its communication (start to end of its collectives) and its time inside MPI (posts during
        backward too: what the step paid)."""
        self.steps, self.step_s, self.compute_s, self.left, self.comm_s, self.mpi_s = 0, 0.0, 0.0, None, 0.0, 0.0

    def _mode(self, name: str) -> Synchronizer:
        cls, keys = CHOICES[name]
        return cls(self.comm, dataclasses.replace(self.config, **keys))

    @property
    def replicas_identical(self) -> bool:
        return self.inner.replicas_identical

    @property
    def rank_local(self) -> tuple:
        return self.inner.rank_local

    def start(self, model, updater) -> None:
        self.reset()
        self.model, self.updater = model, updater
        self.inner.start(model, updater)

    def grads_ready(self, model, start: int) -> None:
        self.inner.grads_ready(model, start)

    def step(self, model, updater) -> None:
        entered = time.perf_counter()
        before = self.comm.comm_seconds  # the step's collectives, posted ones included (they complete in it)
        self.inner.step(model, updater)
        left = time.perf_counter()
        if self.left is not None:  # since the last step ended: data, forward and backward, then this step's sync
            self.compute_s, self.steps = self.compute_s + entered - self.left, self.steps + 1
            self.step_s += left - self.left
            self.comm_s += self.comm.comm_seconds - before
            self.mpi_s += self.comm.mpi_seconds - self.mpi_mark
        self.mpi_mark, self.left = self.comm.mpi_seconds, left

    def end_epoch(self, model, updater) -> None:
        """The mode's epoch end, then the next epoch's choice (a collective: every rank measures and decides
        alike)."""
        self.inner.end_epoch(model, updater)
        per_step = max(self.steps, 1)  # nothing of start-up or epoch ends
        step_ms, compute_ms = (1e3 * self.comm.max(s / per_step) for s in (self.step_s, self.compute_s))
        measured_ms, exposed_ms = (1e3 * self.comm.max(s / per_step) for s in (self.comm_s, self.mpi_s))
        free_ms = 1e3 * self.comm.max((self.step_s - self.mpi_s) / per_step)
        network = measure_network(self.comm, 4 * (model.params.size - model.dense_start), model.xp)
        predicted = self.predicted_ms(network, model)
        if self.steps:  # the same on every rank: an epoch of one step measures nothing
            self.measured[self.choice] = step_ms
            self.free_ms = max(self.free_ms, free_ms)
            if predicted[self.choice] > 0:  # one rank predicts no communication
                self.calibration = max(self.calibration, exposed_ms / predicted[self.choice])
        expected = {name: self.measured.get(name, self.free_ms + self.calibration * ms)
                    for name, ms in predicted.items()}
        chosen = choose(expected)
        self.records.append({"job_epoch": len(self.records) + 1,  # of this job: a resumed run counts from 1 again
                             "ran": self.choice, "step_ms_measured": step_ms, "compute_ms": compute_ms,
                             "comm_ms_measured": measured_ms, "mpi_ms_measured": exposed_ms,
                             "comm_ms_predicted": predicted[self.choice],
                             "network": {"latency_us": network.latency_us,  # no rate: one rank, or too fast to see
                                         "gbps": network.gbps if network.byte_s > 0 else None},
                             "predicted_ms": predicted, "calibration": self.calibration,
                             "expected_step_ms": expected, "next": chosen})
        log.info("sync auto: %s ran this epoch: a step of %.2f ms, communication %.2f ms of it measured (%.2f inside "
                 "MPI), %.2f predicted, the step's compute %.2f ms; expected step (measured where a mode ran, else "
                 "%.2f ms without communication and %.2fx the predicted communication): %s; next epoch: %s",
                 self.choice, step_ms, measured_ms, exposed_ms, predicted[self.choice], compute_ms, self.free_ms,
                 self.calibration, ", ".join(f"{name} {ms:.2f} ms" for name, ms in expected.items()), chosen)
        if chosen != self.choice:
            self._switch(chosen)
        self._new_epoch()

    def _switch(self, name: str) -> None:
        """Run the mode `name` from now on, started from the model as it is (identical on every rank). A
        collective."""
        self.choice, self.inner = name, self._mode(name)
        self.inner.start(self.model, self.updater)

    def predicted_ms(self, network: Network, model) -> dict[str, float]:
        """Each candidate's communication per step on `network`, in ms, by the cost model (sharing's message as at
        its adaptive band's densest; averaging's Allreduce every `frequency` steps, once per epoch taken as every
        100)."""
        ranks, n = self.comm.size, model.params.size - model.dense_start
        first, second = allreduce_bytes(model.layout[len(model.sparse_tables):], self.config.powersgd_rank)
        sharing = allgather_exchange(network, [16 + 4 * ADAPTIVE_DEFAULTS["max_sparsity"] * n] * ranks)[0]
        frequency = self.config.frequency if isinstance(self.config.frequency, int) else 100
        seconds = {"dense": network.allreduce(4 * n, ranks),
                   "bf16": network.alltoallv(2 * n * (ranks - 1) / ranks, ranks)
                   + network.allgatherv([2 * n / ranks] * ranks),
                   "powersgd": network.allreduce(first, ranks) + network.allreduce(second, ranks),
                   "sharing": sharing, "averaging": network.allreduce(4 * n, ranks) / frequency}
        return {name: 1e3 * s for name, s in seconds.items()}

    def state(self) -> dict:
        """The choice in force (its index in CHECKPOINT_CODES), each mode's measured step (`auto_measured_NAME`, ms),
        the step without communication, the calibration, and the mode's own state."""
        return {"auto_choice": CHECKPOINT_CODES.index(self.choice), FREE: self.free_ms, CALIBRATION: self.calibration,
                **{f"{MEASURED}{name}": ms for name, ms in self.measured.items()}, **self.inner.state()}

    def load_state(self, numbers: dict, arrays: dict) -> None:
        name = CHECKPOINT_CODES[int(numbers.get("auto_choice", 0))]
        if name != self.choice:
            self._switch(name)
        self.measured = {key[len(MEASURED):]: float(ms) for key, ms in numbers.items() if key.startswith(MEASURED)}
        self.free_ms = float(numbers.get(FREE, 0.0))
        self.calibration = float(numbers.get(CALIBRATION, 1.0))
        ours = ("auto_choice", FREE, CALIBRATION)
        self.inner.load_state({k: v for k, v in numbers.items() if k not in ours and not k.startswith(MEASURED)},
                              arrays)

    def load_rank_arrays(self, model, updater, saved: dict) -> None:
        self.inner.load_rank_arrays(model, updater, saved)

    def merged(self, name: str, array):
        return self.inner.merged(name, array)

    def metrics(self) -> dict:
        return self.inner.metrics()

    def summary(self) -> dict:
        return {"sync_auto": self.records}
