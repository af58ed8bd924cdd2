"""`sharing`: threshold-encoded update sharing (DL4J SharedTrainingMaster after Strom 2015).

Each rank runs its own updater and adds the resulting UPDATE (learning rate applied) to a
per-rank residual. Every element with |r_i| >= tau leaves the residual as a signed +-tau
and goes into this rank's message (sparse indices, or a bitmap when denser than 1/16).
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

from collections import Counter

import numpy as np

from mpitrain.base.errors import MpitrainError
from mpitrain.kernels.threshold import NaNResidual, add_to_residual, message_capacity, threshold_encode, warm_up
from mpitrain.kernels.threshold.message import HEADER_SIZE
from mpitrain.parallel.costmodel import Network, allreduce_bytes
from mpitrain.parallel.sync.base import Synchronizer, clip_gradients
from mpitrain.parallel.sync.exchange import EXCHANGES, INT32_BYTES, choose_exchange


class SharingSync(Synchronizer):
    """Residual + threshold messages, exchanged by Allgatherv, split by blocks or summed by recursive halving and
    doubling; see the module docstring."""

    rank_local = ("stats", "updater_state", "sync/residual")  # the parameters are one model, the rest each rank's

    def __init__(self, comm, config):
        super().__init__(comm, config)
        self.network = Network.of(config.latency_us, config.link_gbps)

    def reset(self) -> None:
        self.tau = float(self.config.threshold)
        self.residual = None  # `start` allocates it, zero
        self.steps = 0
        self.last = {"tau": self.tau, "sparsity": 0.0, "sent": 0, "exchange": None}
        self.exchanged = Counter()  # steps of each exchange since the last metrics()

    def start(self, model, updater) -> None:
        super().start(model, updater)
        self.residual = model.xp.zeros_like(model.params)
        self.ws = model.workspace.part("sharing")
        n = model.params.size
        self.message = self.ws("message", (message_capacity(n, self.config.encoding),), np.int32)
        # `auto` allgathers only while the messages' bytes stay within a dense Allreduce's: enough for that
        dense_values = int(allreduce_bytes(n * model.params.itemsize, self.comm.size)) // INT32_BYTES
        self.ws.at_least("received", self.message.size + dense_values + self.comm.size * HEADER_SIZE, np.int32)
        warm_up(model.params)

    def step(self, model, updater) -> None:
        self.steps += 1
        clip = self.config.residual_clip
        limit = clip["factor"] * self.tau if clip and self.steps % clip["every"] == 0 else None
        clip_gradients(model, updater.clip_norm)
        add_to_residual(self.residual, updater.delta(model.grads, model.params), limit)  # one pass
        sent_tau = self.tau
        try:
            message = threshold_encode(self.residual, sent_tau, self.config.encoding, self.message)
        except NaNResidual:  # the others learn it from the allgathered sizes: an empty message
            message = self.residual[:0].view(model.xp.int32)
        sizes = self.comm.allgather_counts(message.size)
        if not sizes.all():
            raise MpitrainError(f"training diverged: the update of rank {int(sizes.argmin())} holds NaN after "
                                f"{self.steps} sharing steps; the last good checkpoint is kept; "
                                "try a lower optimizer.lr")
        exchange = choose_exchange(self.config.exchange, self.network, sizes, model.params.size,
                                   model.params.itemsize)
        received = self.ws.at_least("received", int(sizes.sum()), np.int32)
        sent = EXCHANGES[exchange](self.comm, message, sizes, model.params, received)
        sparsity = sent / (self.comm.size * model.n_params)
        self._adapt(sparsity)
        self.exchanged[exchange] += 1
        self.last = {"tau": sent_tau, "sparsity": sparsity, "sent": sent, "exchange": exchange}

    def _adapt(self, sparsity: float) -> None:
        adaptive = self.config.adaptive
        if not adaptive:
            return
        if sparsity < adaptive["min_sparsity"]:
            self.tau *= adaptive["decay"]
        elif sparsity > adaptive["max_sparsity"]:
            self.tau /= adaptive["decay"]

    def _end_epoch(self, model, updater) -> None:
        if updater.state.size:
            self.comm.average_(updater.state)

    def numbers(self) -> dict:
        return {"tau": self.tau, "steps": self.steps}

    def arrays(self) -> dict:
        return {"residual": self.residual}

    def load_numbers(self, numbers: dict) -> None:
        self.tau = float(numbers.get("tau", self.tau))
        self.steps = int(numbers.get("steps", 0))

    def metrics(self) -> dict:
        """The last step's tau, sparsity, elements sent and exchange; `allgather_steps`, `split_steps` and
        `recursive_steps`: the steps each exchange ran since the last call (a metrics window)."""
        counts = {f"{name}_steps": self.exchanged[name] for name in EXCHANGES}
        self.exchanged.clear()
        return {**self.last, **counts}
