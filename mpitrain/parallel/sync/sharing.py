"""`sharing`: threshold-encoded update sharing (DL4J SharedTrainingMaster after Strom 2015).

Each rank runs its own updater and adds the resulting UPDATE (learning rate applied) to a
per-rank residual. The codec in the mode's slot (`sync.codec`, `mpitrain.parallel.sync.codec`)
makes this rank's message of it: the threshold codec sends every element with |r_i| >= tau,
which leaves the residual as a signed +-tau (sparse indices, or a bitmap when denser than 1/16).
The message sizes are allgathered; a NaN on any rank (its message empty) stops every rank
there. Then the messages are exchanged (`sync.exchange`, `mpitrain.parallel.sync.exchange`): by
Allgatherv, every rank adding all of them in rank order; split by index blocks, each
block summed on one rank and the sums allgathered; or as integer counts summed by recursive
halving and doubling in 2 log2 N pairwise exchanges; `auto` picks one per step from the
sizes and the cost model. Every rank adds the same values, divided by the number of ranks,
so the replicas stay bit-identical. Dividing makes the step the MEAN of the ranks' updates,
as `allreduce` averages gradients: a learning rate means the same in every mode and at
any rank count (DL4J adds the sum; multiply lr by N for its behaviour). Nothing is lost,
only delayed: what was not sent stays in the residual.

tau adapts after DL4J's AdaptiveThresholdAlgorithm: when the last step's sparsity (over
all ranks' messages, so every rank computes the same tau) fell below the band, tau is
multiplied by `decay`; above it, divided. The residual is clipped to +-factor*tau every
`every` steps, and the updater state is averaged at each epoch end.

A step allocates nothing on the `allgather` exchange: the message is written into a buffer
of its longest length, and the messages are gathered into one that holds what `auto` lets
the allgather carry (at most a dense Allreduce's bytes), grown once if a forced `allgather`
needs more (the model's workspace, part `sharing`).

The parameters are one model, bit-identical on every rank; each rank's residual and updater
state (averaged at each epoch end) are its own. A checkpoint leaves them alone: it keeps the
parameters as trained, the ranks' mean residual and updater state (`merged`: the mean residual
is what the messages would add, so nothing pending is lost) for a resume on any number of
ranks, and each rank's own residual and updater state for an exact resume on as many. The
parameters are not given the residual: adding it at once would apply updates that accumulated
for many steps in one step (on the MLP it cost a point of test accuracy), and the saved model
would not be the one just evaluated.
"""
from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from dataclasses import dataclass

import numpy as np

from mpitrain.base.errors import MpitrainError
from mpitrain.base.options import ALLOWED, Options, check_value, option, optional_feature
from mpitrain.kernels.threshold import add_to_residual
from mpitrain.kernels.threshold.message import ENCODINGS as MESSAGE_ENCODINGS
from mpitrain.kernels.threshold.message import HEADER_SIZE
from mpitrain.parallel.costmodel import Network, allreduce_bytes
from mpitrain.parallel.sync.base import Synchronizer, clip_gradients
from mpitrain.parallel.sync.codec import CODECS
from mpitrain.parallel.sync.exchange import EXCHANGES, INT32_BYTES, choose_exchange

ENCODINGS = ("auto", *MESSAGE_ENCODINGS)
EXCHANGE_CHOICES = ("auto", *EXCHANGES)
ADAPTIVE_DEFAULTS = {"min_sparsity": 1.0e-4, "max_sparsity": 1.0e-2, "decay": 0.965936}
RESIDUAL_CLIP_DEFAULTS = {"factor": 5.0, "every": 5}


@dataclass(frozen=True)
class SharingOptions(Options):
    """The keys of `sync` that `sharing` reads (beside every mode's: `mpitrain.config.sections.SyncConfig`)."""

    ON_RESUME = ALLOWED

    threshold: float = option(1.0e-3, "sharing: the initial threshold tau.", domain="(0, 1e6]")
    adaptive: typing.Union[bool, dict] = option(
        True, "sharing: adapt tau to keep the sparsity in a band: false, true (the defaults) or a mapping "
              "{min_sparsity: 1e-4, max_sparsity: 1e-2, decay: 0.965936}.")
    residual_clip: typing.Union[bool, dict] = option(
        True, "sharing: clip the residual to +-factor*tau every `every` steps: false, true (the defaults) or a "
              "mapping {factor: 5.0, every: 5}.")
    codec: str = option("threshold", "sharing: how a rank's residual becomes its message (the codec slot, "
                                     "mpitrain/parallel/sync/codec.py): threshold, DL4J's +-tau elements.", CODECS)
    encoding: str = option("auto", "sharing: message body: sparse indices, a bitmap, or auto (a bitmap once "
                                    "denser than 1/16).", ENCODINGS)
    exchange: str = option("auto", "sharing: how the messages cross the network: allgather (every rank receives "
                                   "every message: bytes per rank grow with the ranks), split (each rank sums one "
                                   "index block of all messages, then the sums are allgathered, sparse or dense: "
                                   "never more bytes than a dense Allreduce, plus headers), recursive (the messages "
                                   "as integer counts, summed by recursive halving and gathered by recursive "
                                   "doubling: 2 log2 N messages per rank, blocks sparse or dense) or auto (each "
                                   "step, the one the cost model of latency_us and link_gbps predicts fastest).",
                           EXCHANGE_CHOICES)
    latency_us: float = option(1.0, "sharing: the network's latency per message in microseconds, as the cost model "
                                    "of exchange: auto sees it; it steers auto's choice and nothing else.",
                               domain="[0, 1e7]")
    link_gbps: float = option(100.0, "sharing: the network's link rate in Gb/s (100: InfiniBand EDR), as the cost "
                                     "model of exchange: auto sees it; it steers auto's choice and nothing else.",
                              domain="(0, 1e5]")

    def validate(self, where, prefix):
        """The domains, the adaptive band and the residual clip checked; `true` options as their defaults."""
        self.check_domains(where, prefix)
        adaptive = optional_feature(self.adaptive, ADAPTIVE_DEFAULTS, where, f"{prefix}adaptive")
        if adaptive:
            a = adaptive
            check_value(0 < a["min_sparsity"] < a["max_sparsity"] <= 1, where, f"{prefix}adaptive",
                        a, "0 < min_sparsity < max_sparsity <= 1")
            check_value(0 < a["decay"] < 1, where, f"{prefix}adaptive.decay", a["decay"], "a number in (0, 1)")
        clip = optional_feature(self.residual_clip, RESIDUAL_CLIP_DEFAULTS, where, f"{prefix}residual_clip")
        if clip:
            check_value(1 <= clip["factor"] <= 1e6, where, f"{prefix}residual_clip.factor", clip["factor"],
                        "a number in [1, 1e6]")
            check_value(isinstance(clip["every"], int) and 1 <= clip["every"] <= 1e9, where,
                        f"{prefix}residual_clip.every", clip["every"], "an integer in [1, 1e9]")
        carried = CODECS[self.codec].exchanges
        check_value(self.exchange in ("auto", *carried), where, f"{prefix}exchange", self.exchange,
                    f"auto or one of the exchanges that carry {self.codec}'s messages, {carried}")
        return dataclasses.replace(self, adaptive=adaptive, residual_clip=clip)


class SharingSync(Synchronizer):
    """Residual + the codec's messages (threshold-encoded), exchanged by Allgatherv, split by blocks or summed by
    recursive halving and doubling; see the module docstring."""

    Options = SharingOptions
    rank_local = ("stats", "updater_state", "sync/residual")  # the parameters are one model, the rest each rank's
    state_names = ("tau", "steps", "residual")

    def __init__(self, comm, config):
        super().__init__(comm, config)
        self.network = Network.of(self.options.latency_us, self.options.link_gbps)
        self.codec = CODECS[self.options.codec](self.options.encoding)

    def reset(self) -> None:
        self.tau = float(self.options.threshold)
        self.residual = None  # `start` allocates it, zero
        self.steps = 0
        self.last = {"tau": self.tau, "sparsity": 0.0, "sent": 0, "exchange": None}
        self.exchanged = Counter()  # steps of each exchange since the last metrics()

    def start(self, model, updater) -> None:
        super().start(model, updater)
        self.residual = model.xp.zeros_like(model.params)
        self.ws = model.workspace.part("sharing")
        n = model.params.size
        self.message = self.ws("message", (self.codec.capacity(n),), np.int32)
        # `auto` allgathers only while the messages' bytes stay within a dense Allreduce's: enough for that
        dense_values = int(allreduce_bytes(n * model.params.itemsize, self.comm.size)) // INT32_BYTES
        self.ws.at_least("received", self.message.size + dense_values + self.comm.size * HEADER_SIZE, np.int32)
        self.codec.warm_up(model.params)

    def step(self, model, updater) -> None:
        self.steps += 1
        clip = self.options.residual_clip
        limit = clip["factor"] * self.tau if clip and self.steps % clip["every"] == 0 else None
        clip_gradients(model, updater.clip_norm)
        add_to_residual(self.residual, updater.delta(model.grads, model.params), limit)  # one pass
        sent_tau = self.tau
        message = self.codec.encode(self.residual, sent_tau, self.message)
        if message is None:  # NaN: the others learn it from the allgathered sizes, an empty message
            message = self.message[:0]
        sizes = self.comm.allgather_counts(message.size)
        if not sizes.all():
            raise MpitrainError(f"training diverged: the update of rank {int(sizes.argmin())} holds NaN after "
                                f"{self.steps} sharing steps; the last good checkpoint is kept; "
                                "try a lower optimizer.lr")
        exchange = choose_exchange(self.options.exchange, self.network, sizes, model.params.size,
                                   model.params.itemsize, self.codec.exchanges)
        received = self.ws.at_least("received", int(sizes.sum()), np.int32)
        sent = EXCHANGES[exchange](self.comm, self.codec, message, sizes, model.params, received)
        for table in model.sharded_tables:  # rows summed exactly by their owners in backward: stepped as they are
            table.step(updater)
        sparsity = sent / (self.comm.size * model.n_params)
        self._adapt(sparsity)
        self.exchanged[exchange] += 1
        self.last = {"tau": sent_tau, "sparsity": sparsity, "sent": sent, "exchange": exchange}

    def _adapt(self, sparsity: float) -> None:
        adaptive = self.options.adaptive
        if not adaptive:
            return
        if sparsity < adaptive["min_sparsity"]:
            self.tau *= adaptive["decay"]
        elif sparsity > adaptive["max_sparsity"]:
            self.tau /= adaptive["decay"]

    def _end_epoch(self, model, updater) -> None:
        if updater.state.size:
            self.comm.average_(updater.state)

    def metrics(self) -> dict:
        """The last step's tau, sparsity, elements sent and exchange; `allgather_steps`, `split_steps` and
        `recursive_steps`: the steps each exchange ran since the last call (a metrics window)."""
        counts = {f"{name}_steps": self.exchanged[name] for name in EXCHANGES}
        self.exchanged.clear()
        return {**self.last, **counts}
