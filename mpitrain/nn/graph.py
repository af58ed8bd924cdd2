"""A model of named nodes: several inputs, merges, embeddings; the flat-buffer contract of every model.

    model:
      graph:
        - {name: emb, type: embedding, input: categorical, dim: 8}
        - {name: flat, type: flatten, input: emb}
        - {name: joined, type: concat, inputs: [flat, numeric]}
        - {name: hidden, type: dense, input: joined, units: 64, activation: relu}
        - {name: out, type: dense, input: hidden, units: 1}

A node is a layer (`type` one of `GRAPH_TYPES`, its arguments as in `model.layers`) with a
unique `name`, reading one `input` or, for `concat`, `add` and cross-attention (`attention`
with `inputs: [queries, memory]`: `Layer.joined_by`), several `inputs`: the dataset's column
groups (`numeric`, a row of x, and `categorical`, its ids: `Manifest.input_groups`), its sequence
columns (each the input of its name, `(None, F)`: `Manifest.sequence_inputs`) or nodes named
before it. The last node is the output; every node must lead to it.
An `embedding` reads `categorical` itself.

A sequence value carries its lengths (docs/sequences.md): forward tells each layer its input's
(`layer.lengths`) and carries them on by `output_lengths` while the value is a sequence. A merge
of sequences needs one set of lengths: `build_graph` refuses one whose sequences do not all come
from the same column through layers that keep lengths (`Layer.keeps_lengths`; a strided or
`valid` conv1d does not). Cross-attention's two sequences may differ; its output has its queries'.

A node's `activation` runs fused with its bias add (`FusesActivation`); an activation node
(`type: relu`) runs on its own, since the value it reads may be read by other nodes as it is.

Nodes run in the order written (so a node reads only what is above it). Backward runs them
in reverse; a value read by several nodes gets the sum of their gradients; nodes that lead
to no parameter are skipped. The embedding tables come first in the flat buffers, the other
parameters after them in node order, so the dense part (`dense_start` on) fills from its end
as in a `Sequential` (`grads_ready` reports it) and the tables' rows go by a sparse exchange
(`sparse_tables`, `mpitrain.parallel.sync.sparse`).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.base.errors import ConfigError
from mpitrain.data.sequences import Inputs, SequenceBatch
from mpitrain.nn.embedding import Embedding, TableLayer
from mpitrain.nn.feature_tokens import FeatureTokens
from mpitrain.nn.layer_types import GRAPH_TYPES
from mpitrain.nn.layers import as_numbers, is_sequence, varying
from mpitrain.nn.merge import Merge
from mpitrain.nn.model import (
    LAYER_ARGUMENTS,
    Budget,
    Network,
    _fuse_activations,
    _with_activation_layers,
    auto_shard,
    build_model,
    check_freeze,
    check_memory,
    estimated_size,
    sharded_share,
)
from mpitrain.nn.positional import Positional

NODE_KEYS = ("name", "type", "input", "inputs", "freeze")


@dataclass
class Node:
    """One node: its name, the names it reads, its layers (a layer and its activation layer, or one merge)."""

    name: str
    inputs: list[str]
    layers: list
    spec: dict  # as the config wrote it

    @property
    def merge(self) -> Merge | None:
        return self.layers[0] if isinstance(self.layers[0], Merge) else None


class Graph(Network):
    """Named nodes over a row's column groups and sequence columns, a loss on the last node's output; see the
    module docstring.

    `groups` are the dataset's column groups (`Manifest.input_groups`: `numeric` in x, `categorical` the batch's
    ids, an `Inputs` column); `input_shape` is what the model reads of a
    row (`Manifest.input_shape`: x's shape, or `(None, F)` for one sequence column alone); `sequences` the
    sequence columns' shapes by name (`Manifest.sequence_inputs`), read from a `Inputs` batch (or from a
    `SequenceBatch`, the one column of a dataset of it alone).
    """

    def __init__(self, nodes: list[Node], groups: dict, input_shape: tuple, loss: str, xp, dtype,
                 loss_options: dict | None = None, sequences: dict[str, tuple] | None = None):
        self.nodes, self.groups, self.input_shape = nodes, groups, tuple(input_shape)
        self.sequences = dict(sequences or {})
        shapes = {**{name: group.shape for name, group in groups.items()}, **self.sequences}
        layers, names, param_shapes, stat_shapes, self.first_layer = [], [], [], [], []
        self.gives_sequence = []  # per layer: whether its output is a sequence (its lengths are carried on)
        for node in nodes:
            self.first_layer.append(len(layers))  # where the node's layers begin in `layers`
            inputs = [shapes[name] for name in node.inputs]
            shape = node.merge.merged_shape(inputs) if node.merge else inputs[0]
            for k, layer in enumerate(node.layers):  # a merge has no parameters and gives the merged shape
                param_shapes.append(layer.param_shapes(shape))
                stat_shapes.append(layer.stat_shapes(shape))
                shape = shape if node.merge else layer.output_shape(shape)
                self.gives_sequence.append(is_sequence(shape))
                layers.append(layer)
                names.append(node.name if k == 0 else f"{node.name}.{type(layer).__name__.lower()}")
            shapes[node.name] = shape
        self.output_shape = shapes[nodes[-1].name]
        tables = [i for i, layer in enumerate(layers) if layer.tables]  # embeddings and bags
        order = tables + [i for i in range(len(layers)) if i not in tables]
        super().__init__(layers, names, param_shapes, stat_shapes, loss, xp, dtype, loss_options, order)
        trainable, trainable.sparse_tables = self.trainable, []  # the tables training updates, in its coordinates
        for i in tables:
            start = self.grads_start[i] - self.trainable_start
            for table in layers[i].tables if i not in self.frozen else ():  # a layer's tables lie in its order
                table.start, start = start, start + table.rows * table.dim
                trainable.sparse_tables.append(table)
        trainable.dense_start = max((table.stop for table in trainable.sparse_tables), default=0)
        # the one input is the whole row when the dataset has no column groups (an image stays an image)
        self.whole_row = len(groups) == 1 and next(iter(groups.values())).shape == self.input_shape
        self.needs_grad = {name: False for name in shapes}  # whether backward runs through the value's node
        for node, first in zip(nodes, self.first_layer):
            self.needs_grad[node.name] = any((layer.params or layer.collective) and first + k not in self.frozen
                                             for k, layer in enumerate(node.layers)) or \
                any(self.needs_grad[name] for name in node.inputs)
        self.accumulated = self.workspace.part("graph")
        for node in nodes:  # a node's own `activation`; an activation node may read any value, so it runs itself
            _fuse_activations(node.layers)

    def forward(self, x, training: bool = False, key: tuple = (0,), until: str | None = None):
        """The output of rows `x` (batch, *input_shape; a `Inputs` or `SequenceBatch` of a dataset of
        sequences), or with `until` node `until`'s (after its activation); `key` (seed, rank, epoch, step) seeds
        dropout. Each layer is told its input's lengths (`layer.lengths`, None for a value that is no sequence)."""
        values, lengths = self._inputs(x)
        layer_index = 0
        for node in self.nodes:
            inputs = [values[name] for name in node.inputs]
            if node.merge:  # its output carries its first input's lengths (`build_graph` checks merged ones agree)
                merge = node.merge
                inputs = [as_numbers(value, merge.ws, f"numbers{k}", self.params.dtype) for k, value in enumerate(inputs)]
                merge.key, merge.lengths = (*key, layer_index), lengths[node.inputs[0]]
                merge.input_lengths = [lengths[name] for name in node.inputs]
                value = merge.forward(inputs, training)
                steps = lengths[node.inputs[0]] if self.gives_sequence[layer_index] else None
                layer_index += 1
            else:
                value, steps = inputs[0], lengths[node.inputs[0]]
                for _ in node.layers:
                    value, steps = self.run_layer(layer_index, value, steps, training, key)
                    layer_index += 1
            values[node.name], lengths[node.name] = value, steps
            if node.name == until:
                break
        return values[until or self.nodes[-1].name]

    def _inputs(self, x) -> tuple[dict, dict]:
        """({input name: value}, {input name: its lengths, None for a column group}) of a batch: rows of x cut by
        column group, and each column of an `Inputs` (the categorical ids; a sequence column, a `SequenceBatch`, with
        its lengths) or a `SequenceBatch` (the one column's)."""
        if isinstance(x, SequenceBatch):
            x = Inputs(None, {next(iter(self.sequences)): x})
        rows, columns = (x.x, x.columns) if isinstance(x, Inputs) else (x, {})
        values = {name: rows if self.whole_row else rows[:, group.start:group.stop].reshape(len(rows), *group.shape)
                  for name, group in self.groups.items() if name not in columns}
        lengths = dict.fromkeys(values)
        for name, batch in columns.items():
            values[name], lengths[name] = (batch.values, batch.lengths) if isinstance(batch, SequenceBatch) else \
                (batch, None)
        return values, lengths

    def backward(self, dy, grads_ready=None) -> None:
        """Backpropagate through the nodes in reverse (those that lead to no parameter training updates are
        skipped: a frozen encoder under a new head is not run backward); after a node with dense parameters,
        `grads_ready(start)` (if given) learns that the trainable part's `grads[start:]` are final."""
        grads, summed = {self.nodes[-1].name: dy}, set()
        for index in range(len(self.nodes) - 1, -1, -1):
            node = self.nodes[index]
            if not self.needs_grad[node.name]:
                continue
            d = grads.pop(node.name)
            wanted = [self.needs_grad[name] for name in node.inputs]
            if node.merge:
                outputs = node.merge.backward(d, wanted)
            else:
                for k in range(len(node.layers) - 1, -1, -1):
                    d = node.layers[k].backward(d, input_grad=k > 0 or wanted[0])
                outputs = [d]
            for name, gradient in zip(node.inputs, outputs):
                if gradient is not None:
                    self._accumulate(grads, summed, name, gradient)
            first = self.first_layer[index]
            if self.grads_start[first] - self.trainable_start >= self.trainable.dense_start and \
                    any(layer.params for layer in node.layers):
                self.grads_done(first, grads_ready)

    def _accumulate(self, grads: dict, summed: set, name: str, gradient) -> None:
        """grads[name] += gradient, in a workspace array of its own (`summed` holds the names that have one by now)
        once a second reader adds to it; a grow-only one, as a sequence's size changes from batch to batch."""
        if name not in grads:
            grads[name] = gradient
            return
        if name not in summed:  # the first sum in one pass into the array of its own
            total = varying(self.accumulated, name, gradient.shape, gradient.dtype)
            array_module(total).add(grads[name], gradient, out=total)
            grads[name] = total
            summed.add(name)
        else:
            grads[name] += gradient

    def config_entries(self) -> dict:
        """The config keys that build this model again."""
        return {"model.graph": [node.spec for node in self.nodes], "model.layers": []}


def check_node_spec(spec, key: str) -> None:
    """Refuse a graph node entry that misses a name or input, names an unknown type or argument, or an argument
    out of its domain, naming the key (`model.graph[2].units`) and what was expected."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise ConfigError(f"{key} is {spec!r}, expected a mapping with a 'name' and a 'type'")
    kind = spec.get("type")
    cls = GRAPH_TYPES.get(kind)
    if cls is None:
        raise ConfigError(f"{key}.type is {kind!r}, expected one of {sorted(GRAPH_TYPES)}")
    joined = node_class(spec)
    if issubclass(joined, Merge):
        inputs, count = spec.get("inputs"), joined.input_count
        wanted = "two or more names" if count is None else f"{count} names"
        if "input" in spec or not (isinstance(inputs, list) and all(isinstance(i, str) for i in inputs) and
                                   (len(inputs) == count if count else len(inputs) >= 2)):
            raise ConfigError(f"{key}: {kind} over several `inputs` takes a list of {wanted}, not {inputs!r}"
                              if cls.joined_by else f"{key}: a {kind} node takes `inputs`, a list of {wanted}, "
                              f"not {inputs!r}")
    elif not isinstance(spec.get("input"), str):
        also = " or `inputs`, a list of names" if cls.joined_by else ""
        raise ConfigError(f"{key}: a {kind} node takes one `input` (a name){also}, not "
                          f"{spec.get('input', spec.get('inputs'))!r}")
    check_freeze(spec, key)
    kwargs = {k: v for k, v in spec.items() if k not in NODE_KEYS}
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{key}: {e} (a {kind} node takes {list(inspect.signature(cls).parameters)})") from None
    for name, value in kwargs.items():
        if name in LAYER_ARGUMENTS:
            ok, expected = LAYER_ARGUMENTS[name]
            if not ok(value):
                raise ConfigError(f"{key}.{name} is {value!r}, expected {expected}")


def node_class(spec: dict) -> type:
    """The Layer class of a graph node entry: its type's, or with several `inputs` the class that joins them
    (`Layer.joined_by`: attention over two inputs is cross-attention). Not a collective."""
    cls = GRAPH_TYPES[spec["type"]]
    return cls.joined_by if "inputs" in spec and cls.joined_by else cls


def build_graph(config, groups: dict, input_shape, outputs: int, xp, outputs_name: str = "classes",
                budget: Budget | None = None, sequences: dict[str, tuple] | None = None, steps: int = 1,
                per_step: bool = False, sequence_ids: dict[str, int] | None = None) -> Graph:
    """The Graph of `config.model.graph` (a ModelConfig's) for a dataset of input `groups` and sequence columns
    `sequences` ({name: (None, F)}, the longest `steps` steps), giving `outputs` values (with `per_step`, a class per
    step: a sequence of `outputs` per step, of the first sequence column's lengths; `sequence_ids`: the columns of ids
    the ETL counted, {name: ids}, which a token_embedding or embedding_bag with `ids: auto` on that column takes);
    a node that reads an unknown name, does not fit its input, merges sequences of other lengths, or leads nowhere is a ConfigError naming it.
    With `budget`, a graph estimated to need more than a rank has is refused before allocating (`check_memory`,
    sequences counted at `steps` steps)."""
    sequences = dict(sequences or {})
    taken = sorted(set(groups) & set(sequences))
    if taken:
        raise ConfigError(f"model.graph: the dataset's sequence column {taken[0]!r} has the name of its column group "
                          f"{taken[0]!r}, so a node could not tell them apart; expected the ETL's --sequence columns "
                          "named otherwise")
    nodes, shapes, read = [], {**{name: group.shape for name, group in groups.items()}, **sequences}, set()
    lengths_of = {name: name for name in sequences}  # a sequence value's lengths: those of this column or node
    longest = dict.fromkeys(sequences, steps)  # a sequence value's longest sequence (a [CLS] token adds a step)
    params, activations = 0, sum(estimated_size(shape, steps) for shape in shapes.values())
    for i, spec in enumerate(config.graph):
        key = f"model.graph[{i}]"
        check_node_spec(spec, key)
        spec = dict(spec)  # the node's own (`shard: auto` is resolved in it)
        name = spec["name"]
        if name in shapes:
            raise ConfigError(f"{key}.name {name!r} is taken (by {'an input' if name in groups else 'a node above'}); "
                              "expected a new name")
        inputs = spec["inputs"] if "inputs" in spec else [spec["input"]]
        for source in inputs:
            if source not in shapes:
                raise ConfigError(f"{key} ({name}) reads {source!r}: no input or node above has that name; expected "
                                  f"one of {sorted(shapes)}")
        read.update(inputs)
        try:
            layer = node_class(spec)(**{k: v for k, v in spec.items() if k not in NODE_KEYS})
            layer.frozen = spec.get("freeze", False)
            longest_here = longest.get(inputs[0], steps)
            if isinstance(layer, Positional) and layer.max_steps == "auto":
                layer.max_steps = longest_here  # the longest sequence at its input
            if isinstance(layer, FeatureTokens) and inputs[0] == "categorical":
                raise ValueError("it would read the categorical ids as numbers; expected inputs: [numeric, EMBEDDING] "
                                 "(the categorical columns' tokens through an embedding node)")
            if getattr(layer, "ids", None) == "auto" and inputs[0] in (sequence_ids or {}):
                layer.ids = sequence_ids[inputs[0]]  # a token_embedding's or embedding_bag's column of ids
            if isinstance(layer, Embedding):
                if inputs != ["categorical"] or "categorical" not in groups:
                    raise ValueError("an embedding reads the dataset's `categorical` ids (input: categorical)"
                                     + ("" if "categorical" in groups else "; this dataset has no categorical columns"))
                layer.take_ids(groups["categorical"].ids)
            if isinstance(layer, TableLayer) and layer.ids != "auto":  # a bag's 'auto' is refused below
                if layer.shard == "auto":  # decided here, recorded in the node (the run's config.yaml says it)
                    layer.shard = spec["shard"] = auto_shard(layer.table_sizes(), np.dtype(config.dtype).itemsize,
                                                             budget)
                if layer.collective:
                    params += sharded_share(layer.table_sizes(), budget.ranks if budget else 1)
            layers = [layer] if isinstance(layer, Merge) else _with_activation_layers([layer])
            shape = layer.merged_shape([shapes[s] for s in inputs]) if isinstance(layer, Merge) else shapes[inputs[0]]
            shares = isinstance(layer, Merge) and layer.shares_lengths
            lengths_of[name] = _merged_lengths(inputs, lengths_of) if shares else lengths_of.get(inputs[0])
            if isinstance(layer, Merge):
                params += sum(map(math.prod, layer.param_shapes(shape).values()))
            else:
                for each in layers:
                    params += sum(map(math.prod, [*each.param_shapes(shape).values(),
                                                  *each.stat_shapes(shape).values()]))
                    if is_sequence(shape) and is_sequence(each.output_shape(shape)):
                        longest_here = int(each.output_lengths(np.array([longest_here]))[0])
                    shape = each.output_shape(shape)
                    activations += estimated_size(shape, steps)
                    if not each.keeps_lengths:
                        lengths_of[name] = name
            if is_sequence(shape):
                longest[name] = longest_here
            else:
                lengths_of.pop(name, None)
        except ValueError as e:
            raise ConfigError(f"{key} ({name}, {spec['type']}) on inputs of shape "
                              f"{[list(shapes[s]) for s in inputs]}: {e}") from None
        shapes[name] = shape
        nodes.append(Node(name, inputs, layers, spec))
    if not nodes:
        raise ConfigError("model.graph is empty; expected a list of nodes")
    unused = [node.name for node in nodes[:-1] if node.name not in read]
    if unused:
        raise ConfigError(f"model.graph: node {unused[0]!r} leads nowhere (no node reads it, and the last node "
                          f"{nodes[-1].name!r} is the output); expected every node to lead to the output")
    last = nodes[-1].name
    if shapes[last] != ((None, outputs) if per_step else (outputs,)):
        raise ConfigError(f"model.graph: the last node {last!r} gives outputs of shape {list(shapes[last])}, expected "
                          f"{[None, outputs] if per_step else [outputs]} for the dataset's {outputs} {outputs_name}"
                          f"{' per step (None: a sequence)' if per_step else ''}")
    first = next(iter(sequences), None)
    if per_step and lengths_of[last] != first:
        raise ConfigError(f"model.graph: the last node {last!r} gives a sequence of the lengths of "
                          f"{lengths_of[last]!r}, but the dataset's class per step follows the steps of its first "
                          f"sequence column {first!r}; expected the output to keep that column's steps (no stride, no "
                          "'valid' padding)")
    check_memory("model.graph", params, activations, np.dtype(config.dtype).itemsize, budget)
    return Graph(nodes, groups, input_shape, config.loss, xp, config.dtype, config.loss_options, sequences)


def _merged_lengths(inputs: list[str], lengths_of: dict) -> str | None:
    """The lengths a merge's output carries: those its sequence `inputs` share (`lengths_of`: each sequence value's
    column or node of origin), None when none is a sequence; a ValueError when they differ (the merge's arrays
    would not line up step by step)."""
    origins = {lengths_of[name] for name in inputs if name in lengths_of}
    if len(origins) > 1:
        described = ", ".join(f"{name!r} those of {lengths_of[name]!r}" for name in inputs if name in lengths_of)
        raise ValueError(f"it merges sequences of different lengths ({described}); expected sequences of one "
                         "column through layers that keep its steps, or each sequence pooled first "
                         "(global_max_pool, global_avg_pool, an lstm's last state)")
    return next(iter(origins), None)


def model_outputs(config, manifest) -> tuple[int, str]:
    """(how many values the model of `config` (a ModelConfig) gives for the dataset of `manifest`, what they are):
    one per class or target column, or for an autoencoder (`target: reconstruction`) one per input feature."""
    if config.target == "reconstruction":
        return math.prod(manifest.feature_shape), "input features (model.target: reconstruction)"
    return manifest.outputs, "classes" if manifest.target == "class" else f"{manifest.target} target columns"


def build_network(config, manifest, xp, budget: Budget | None = None) -> Network:
    """The model `config.model` (a ModelConfig) describes for the dataset of `manifest`: a Graph of `graph`, or a
    Sequential of `layers` (which reads a row as numbers, so not a table with categorical ids); `budget` as
    `check_memory`'s. An autoencoder's (`target: reconstruction`) gives its input back (`Network.reconstruct_inputs`)."""
    outputs, outputs_name = model_outputs(config, manifest)
    if config.target == "reconstruction" and "categorical" in manifest.input_groups:
        raise ConfigError(f"model.target is reconstruction, but the dataset has categorical columns "
                          f"{[c['name'] for c in manifest.columns['categorical']]} (ids, not values to reconstruct); "
                          "expected a dataset of numbers or images")
    if manifest.sequences and (config.target == "reconstruction" or
                               not config.graph and manifest.input_shape[0] is not None):
        raise ConfigError(f"the dataset has sequence columns {[c['name'] for c in manifest.sequences]}"
                          f"{' and fixed features' if manifest.feature_shape != (0,) else ''}; expected "
                          f"{'a model that is no autoencoder' if config.target == 'reconstruction' else 'model.graph'}"
                          " (model.layers reads one sequence column alone; docs/sequences.md)")
    steps = max((c["longest"] for c in manifest.sequences), default=1)
    if config.graph:
        model = build_graph(config, manifest.input_groups, manifest.input_shape, outputs, xp, outputs_name, budget,
                            manifest.sequence_inputs, steps, bool(manifest.step_target),
                            {c["name"]: c["ids"] for c in manifest.sequences if "ids" in c})
    elif "categorical" in manifest.input_groups:
        raise ConfigError(f"model.layers reads a row as numbers, but the dataset has categorical columns "
                          f"{[c['name'] for c in manifest.columns['categorical']]} (ids); expected model.graph with "
                          "an embedding of `categorical` (docs/tables.md)")
    else:
        model = build_model(config, manifest.input_shape, outputs, xp, outputs_name, budget,
                            manifest.sequences[0] if manifest.sequences else None, bool(manifest.step_target))
    if config.target == "reconstruction":
        model.reconstruct_inputs()
    return model
