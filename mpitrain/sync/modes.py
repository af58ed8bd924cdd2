"""The dense synchronization modes: none, allreduce (gradients), averaging (parameters)."""
from __future__ import annotations

from mpitrain.sync.base import Synchronizer


class NoSync(Synchronizer):
    """Each rank trains alone: single-process runs and independent baselines."""

    replicas_identical = False

    def step(self, model, updater) -> None:
        model.params += updater.delta(model.grads, model.params)


class AllreduceSync(Synchronizer):
    """Synchronous SGD: average the flat gradient buffer every step, then an identical update everywhere."""

    def step(self, model, updater) -> None:
        self.comm.average_(model.grads)
        model.params += updater.delta(model.grads, model.params)


class AveragingSync(Synchronizer):
    """Local steps; every `frequency` steps (or once per epoch) average the parameters.

    With `average_updater`, the flat updater state is averaged too (DL4J's
    ParameterAveragingTrainingMaster); running statistics always are. An epoch always ends with an averaging, so the
    replicas are identical at every epoch end, whatever the frequency.
    """

    def __init__(self, comm, config):
        super().__init__(comm, config)
        self.steps_since_average = 0

    def step(self, model, updater) -> None:
        model.params += updater.delta(model.grads, model.params)
        self.steps_since_average += 1
        if self.config.frequency != "epoch" and self.steps_since_average >= self.config.frequency:
            self._average(model, updater)

    def _end_epoch(self, model, updater) -> None:
        if self.steps_since_average:
            self._average(model, updater)

    def _flush(self, model, updater) -> None:
        """Average parameters and updater state before a checkpoint, so it holds every rank's work.

        A resumed run then continues exactly as an uninterrupted one, which averaged at the
        same point.
        """
        if self.steps_since_average:
            self._average(model, updater)
        if not self.config.average_updater and updater.state.size:
            self.comm.average_(updater.state)

    def numbers(self) -> dict:
        return {"steps_since_average": self.steps_since_average}

    def load_numbers(self, numbers: dict) -> None:
        self.steps_since_average = int(numbers.get("steps_since_average", 0))

    def _average(self, model, updater) -> None:
        self.comm.average_(model.params)
        self.average_stats(model)
        if self.config.average_updater and updater.state.size:
            self.comm.average_(updater.state)
        self.steps_since_average = 0
