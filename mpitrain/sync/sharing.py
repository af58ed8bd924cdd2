"""`sharing`: threshold-encoded update sharing (DL4J SharedTrainingMaster after Strom 2015).

Each rank runs its own updater and adds the resulting UPDATE (learning rate applied) to a
per-rank residual. Every element with |r_i| >= tau leaves the residual as a signed +-tau
and goes into this rank's message (sparse indices, or a bitmap when denser than 1/16).
All messages are exchanged with Allgather (sizes) + Allgatherv (bodies) and every rank
adds all of them, in rank order and divided by the number of ranks, to its parameters, so
the replicas stay bit-identical. Dividing makes the step the MEAN of the ranks' updates,
as `allreduce` averages gradients: a learning rate means the same in every mode and at
any rank count (DL4J adds the sum; multiply lr by N for its behaviour). Nothing is lost,
only delayed: what was not sent stays in the residual.

tau adapts after DL4J's AdaptiveThresholdAlgorithm: when the last step's sparsity (over
all ranks' messages, so every rank computes the same tau) fell below the band, tau is
multiplied by `decay`; above it, divided. The residual is clipped to +-factor*tau every
`every` steps, and the updater state is averaged at each epoch end.

Before a checkpoint every rank's residual is replaced by the ranks' mean, which keeps the
pending update (the mean residual is what the messages would add) and lets rank 0 save it
beside the parameters; a resumed run, with any number of ranks, starts every rank from it.
The parameters are left as trained: adding the residual to them at once would apply
updates that accumulated for many steps in one step (on the MLP it cost a point of test
accuracy), and the saved model would not be the one just evaluated.
"""
from __future__ import annotations

from mpitrain.errors import MpitrainError
from mpitrain.kernels import NaNResidual, add_to_residual, message_count, threshold_decode, threshold_encode, warm_up
from mpitrain.sync.base import Synchronizer


class SharingSync(Synchronizer):
    """Residual + threshold messages exchanged by Allgatherv; see the module docstring."""

    def __init__(self, comm, config):
        super().__init__(comm, config)
        self.tau = float(config.threshold)
        self.residual = None
        self.steps = 0
        self.last = {"tau": self.tau, "sparsity": 0.0, "sent": 0}

    def start(self, model, updater) -> None:
        super().start(model, updater)
        self.residual = model.xp.zeros_like(model.params)
        warm_up(model.params)

    def step(self, model, updater) -> None:
        self.steps += 1
        clip = self.config.residual_clip
        limit = clip["factor"] * self.tau if clip and self.steps % clip["every"] == 0 else None
        add_to_residual(self.residual, updater.delta(model.grads, model.params), limit)  # one pass
        sent_tau = self.tau
        try:
            message = threshold_encode(self.residual, sent_tau, self.config.encoding)
        except NaNResidual:  # the others learn it from the exchange itself: an empty message
            message = self.residual[:0].view(model.xp.int32)
        messages = self.comm.allgatherv(message)
        empty = [rank for rank, m in enumerate(messages) if m.size == 0]  # sizes are host values: no copy
        if empty:
            raise MpitrainError(f"training diverged: the update of rank {empty[0]} holds NaN after {self.steps} "
                                "sharing steps; the last good checkpoint is kept; try a lower optimizer.lr")
        for message in messages:  # rank order on every rank: identical sums, identical replicas
            threshold_decode(message, model.params, 1.0 / len(messages))
        sent = sum(message_count(m) for m in messages)
        sparsity = sent / (len(messages) * model.n_params)
        self._adapt(sparsity)
        self.last = {"tau": sent_tau, "sparsity": sparsity, "sent": sent}

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

    def _flush(self, model, updater) -> None:
        """Before a checkpoint: every rank's residual becomes the ranks' mean (so nothing pending is lost
        and rank 0 holds it all), and the updater state is averaged."""
        self.comm.average_(self.residual)
        self._end_epoch(model, updater)

    def numbers(self) -> dict:
        return {"tau": self.tau, "steps": self.steps}

    def arrays(self) -> dict:
        return {"residual": self.residual}

    def load_numbers(self, numbers: dict) -> None:
        self.tau = float(numbers.get("tau", self.tau))
        self.steps = int(numbers.get("steps", 0))

    def metrics(self) -> dict:
        return dict(self.last)
