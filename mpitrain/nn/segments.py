"""A batch of sequences in segments of K time steps, for truncated backpropagation through time (`train.tbptt_steps`,
docs/sequences.md, "Truncated backpropagation through time"): which layers can run segment by segment, the segments
of a batch, and the recurrent layers' states carried from one segment to the next.

    segments = Segments(model, steps=16)
    for s in range(segments.count(longest)):
        batch, classes = segments.cut(x, y, s)   # segment s; the recurrent layers start from the states kept
        model.forward(batch) ...                 # (zeros for segment 0)
        segments.keep()                          # the states at the segment's end, for segment s + 1
    segments.reset()                             # the layers start from zeros again (evaluation)
"""
from __future__ import annotations

import math

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import ConfigError
from mpitrain.data.sequences import SequenceBatch
from mpitrain.nn.layer_types import LAYER_TYPES
from mpitrain.nn.layers import varying
from mpitrain.nn.recurrent import Recurrent


def check_layers(steps: int, layers: list, graph: list) -> None:
    """Refuse truncated BPTT (`steps` > 0) for a model whose layers (`model.layers`' specs) cannot run segment by
    segment, or a `model.graph`: a ConfigError naming `model.layers[i]` and why. Checked with the config.

    A segment runs a layer whose each step's output depends on that step's input alone (its class says `per_step`)
    and a recurrent layer (the state carried from the step before) that returns every step's output in one
    direction; any other layer is refused for its class's reason (`not_cut`)."""
    if not steps:
        return
    if graph:
        raise ConfigError(f"train.tbptt_steps is {steps}, but the model is a model.graph; expected 0 (truncated BPTT "
                          "runs model.layers)")
    for i, spec in enumerate(layers):
        kind = spec["type"]
        cls = LAYER_TYPES[kind]
        if issubclass(cls, Recurrent):
            if spec.get("bidirectional", False):
                why = "a bidirectional layer reads each sequence backwards from its end, which no segment holds"
            elif not spec.get("return_sequences", False):
                why = "it returns its last state, not a state per step"
            else:
                continue
        elif cls.per_step:
            continue
        else:
            why = cls.not_cut
        recurrent = [name for name, each in LAYER_TYPES.items() if issubclass(each, Recurrent)]
        per_step = [name for name, each in LAYER_TYPES.items() if each.per_step]
        raise ConfigError(f"train.tbptt_steps is {steps}, but model.layers[{i}] ({kind}) cannot be cut into "
                          f"segments: {why}; expected {' or '.join(recurrent)} with return_sequences and one "
                          f"direction, or {', '.join(per_step)} (or train.tbptt_steps: 0)")


class Segments:
    """`model`'s batches in segments of `steps` time steps; its recurrent layers' states kept from the end of one
    segment to start the next (inputs of the next, not backpropagated into). Arrays in the model's workspace part
    `segments`. Nothing here is a collective."""

    def __init__(self, model, steps: int):
        self.steps = steps
        self.recurrent = [layer for layer in model.layers if isinstance(layer, Recurrent)]
        self.ws = model.workspace.part("segments")

    def count(self, longest: int) -> int:
        """The segments of sequences up to `longest` steps long."""
        return math.ceil(longest / self.steps)

    def cut(self, x: SequenceBatch, y, s: int):
        """Segment `s` of batch (`x`, `y` its classes per step): the values copied (C-contiguous, as a layer takes
        them), each sequence's length within the segment (0 for one that ended before it), the classes (-1 at
        padding). Sets the recurrent layers' `initial_states`: zeros for segment 0, else the states `keep` kept."""
        xp = array_module(x.values)
        batch, steps, features = x.values.shape
        start = s * self.steps
        stop = min(start + self.steps, steps)
        values = varying(self.ws, "values", (batch, stop - start, features), x.values.dtype)
        xp.copyto(values, x.values[:, start:stop])
        lengths = self.ws("lengths", x.lengths.shape, x.lengths.dtype)
        xp.subtract(x.lengths, start, out=lengths)
        xp.clip(lengths, 0, stop - start, out=lengths)
        for layer in self.recurrent:
            layer.initial_states = self._kept(layer, batch, x.values.dtype) if s else None
        return SequenceBatch(values, lengths), y[:, start:stop]

    def keep(self) -> None:
        """Keep the recurrent layers' states at the end of the segment that just ran forward, for the next."""
        for layer in self.recurrent:
            final = layer.final_states()
            h = final["h"]
            for name, kept in self._kept(layer, len(h), h.dtype).items():
                kept[...] = final[name]

    def reset(self) -> None:
        """The recurrent layers start from zeros again, as an ordinary forward (evaluation) does."""
        for layer in self.recurrent:
            layer.initial_states = None

    def _kept(self, layer: Recurrent, batch: int, dtype) -> dict:
        """{state: (`batch`, H)}: where `layer`'s states at a segment's end are kept."""
        index = self.recurrent.index(layer)
        return {name: self.ws(f"{index}_{name}", (batch, layer.units), dtype) for name in layer.states}
