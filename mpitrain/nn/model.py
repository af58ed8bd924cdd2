"""A sequential model on the flat-buffer contract (`mpitrain.nn.flat`): layers hold views into
ONE parameter buffer and ONE gradient buffer, so averaging either across ranks is a single
collective; batch norm's running statistics have a flat buffer of their own, `stats`.

    model = Sequential([Dense(256, activation="relu"), Dropout(0.2), Dense(10)], input_shape=(1, 28, 28))
    model = Sequential(layers, (13,), loss="huber", loss_options={"delta": 0.5})          # a loss with options
    model = build_model(config.model, manifest.feature_shape, manifest.num_classes, xp)   # from a config
"""
from __future__ import annotations

import inspect
import math
import os
import typing

import numpy as np

from mpitrain.base.errors import ConfigError
from mpitrain.data.sequences import SequenceBatch
from mpitrain.data.shards import MAX_IDS
from mpitrain.kernels.activations import KINDS
from mpitrain.kernels.im2col import PADDINGS
from mpitrain.nn.embedding import SHARDS
from mpitrain.nn.flat import FlatModel, TrainablePart, flat_views
from mpitrain.nn.layer_types import LAYER_TYPES
from mpitrain.nn.layers import ACTIVATIONS, INIT_SCHEMES, FusesActivation, Layer, as_numbers, is_sequence
from mpitrain.nn.losses import check_loss_options, loss_with_options
from mpitrain.nn.positional import ENCODINGS, Positional
from mpitrain.nn.sequence import SEQUENCE_PADDINGS
from mpitrain.nn.tokens import TokenEmbedding


class Network(FlatModel):
    """What both model kinds share: layers bound to views of the flat buffers, a loss, a workspace part per layer.

    `layers` are every layer in the order forward runs them, `names` their names (the layout's `NAME/array`, the
    workspace part's), `shapes`/`stat_shapes` their parameter and statistic shapes; `param_order` the order of the
    layers' parameters in the flat buffer (default: the layers'); `gives_sequence` (a subclass sets it from its
    shapes) whether each layer's output is a sequence. Subclasses define `forward` (each layer by `run_layer`) and
    `backward`; `forward(x, until=NODE)` stops at a node (a Sequential's layer index, a Graph's node name) and gives
    its activations (`mpitrain predict --embeddings`).
    """

    reconstruction = False  # an autoencoder: its loss's target is its own input (`reconstruct_inputs`)

    def __init__(self, layers: list[Layer], names: list[str], shapes: list[dict], stat_shapes: list[dict],
                 loss: str, xp, dtype, loss_options: dict | None, param_order: list[int] | None = None):
        self.layers, self.names, self.loss = layers, names, loss
        self.loss_options = check_loss_options(loss, loss_options or {})
        self.loss_fn = loss_with_options(loss, self.loss_options, xp)
        order = list(range(len(layers))) if param_order is None else param_order
        self.frozen = [i for i in order if layers[i].frozen and shapes[i]]  # frozen layers first in the buffers
        if self.frozen and len(self.frozen) == sum(map(bool, shapes)):
            raise ConfigError(f"every layer with parameters is frozen ({', '.join(names[i] for i in self.frozen)}), so "
                              "training has nothing to update; expected at least one layer without freeze: true")
        order = self.frozen + [i for i in order if i not in self.frozen]
        super().__init__(_layout([names[i] for i in order], [shapes[i] for i in order]),
                         _layout(names, stat_shapes), xp, dtype)
        sizes = [sum(math.prod(s) for s in shapes[i].values()) for i in order]
        starts = np.cumsum([0, *sizes])
        self.grads_start = [0] * len(layers)  # layer i's gradients begin here
        for position, i in enumerate(order):
            self.grads_start[i] = int(starts[position])
        self.trainable_start = int(starts[len(self.frozen)])
        self._trainable = TrainablePart(self, self.trainable_start) if self.frozen else self
        params = dict(zip(order, _per_layer(flat_views(self.params, self.layout), [shapes[i] for i in order])))
        grads = dict(zip(order, _per_layer(flat_views(self.grads, self.layout), [shapes[i] for i in order])))
        for i, (layer, layer_stats) in enumerate(zip(layers, _per_layer(flat_views(self.stats, self.stats_layout),
                                                                         stat_shapes))):
            layer.bind(params[i], grads[i])
            layer.bind_stats(layer_stats)
            layer.ws = self.workspace.part(names[i])
        self.loss_ws = self.workspace.part("loss")

    @property
    def trainable(self):
        """What training updates (`mpitrain.nn.flat`): this model, or with frozen layers the `TrainablePart` after
        them."""
        return self._trainable

    def grads_done(self, index: int, grads_ready) -> None:
        """Tell `grads_ready` (if given) that backward has finished layer `index`'s gradients, as a start in the
        trainable part's gradients (`grads_ready(start)`: `trainable.grads[start:]` are final); a frozen layer's
        are no one's to send."""
        if grads_ready is not None and index not in self.frozen:
            grads_ready(self.grads_start[index] - self.trainable_start)

    def init_params(self, seed: int, scheme: str) -> None:
        """Draw initial parameters on the host from `seed`, so every backend starts alike."""
        rng = np.random.default_rng(seed)
        for layer in self.layers:
            for name, value in layer.init_params(rng, scheme).items():
                layer.params[name][...] = self.xp.asarray(value, dtype=self.params.dtype)
            for name, value in layer.init_stats().items():
                layer.stats[name][...] = self.xp.asarray(value, dtype=self.stats.dtype)

    def padding_batches(self, batches: int) -> int:
        """How many empty batches (`run_empty_batch`) this rank adds after its `batches` forwards, so that every rank
        runs a model with sharded tables (whose forward is a collective) as often: 0 without them, else the most
        any rank runs less its own (a collective)."""
        if not self.sharded_tables:
            return 0
        return int(self.sharded_tables[0].comm.max(batches)) - batches

    def run_empty_batch(self) -> None:
        """What a forward of no rows does with the other ranks: each sharded table's exchange, in forward's order
        (a collective)."""
        for table in self.sharded_tables:
            table.forward(np.zeros(0, np.int64))

    def reconstruct_inputs(self) -> None:
        """Make this model an autoencoder (`model.target: reconstruction`): the target of its loss is its own input,
        flattened to (rows, features), and binary cross-entropy takes one sigmoid per feature."""
        self.reconstruction = True
        if self.loss == "binary_cross_entropy":  # (rows, 1) only; the same sum over (rows, features)
            self.loss_fn = loss_with_options("multilabel_cross_entropy", self.loss_options, self.xp)

    def run_layer(self, index: int, x, lengths, training: bool, key: tuple):
        """(output, its lengths) of layer `index` on `x`, a sequence of `lengths` (None: not a sequence): the layer is
        told its key (`key` and its index: dropout's seed) and its input's lengths, and the output's lengths are
        carried on (`output_lengths`) while it is a sequence (`gives_sequence`; docs/sequences.md)."""
        layer = self.layers[index]
        layer.key, layer.lengths = (*key, index), lengths
        if not layer.reads_ids:  # an integer sequence column goes in as the model's numbers
            x = as_numbers(x, layer.ws, "numbers", self.params.dtype)
        x = layer.forward(x, training)
        return x, (layer.output_lengths(lengths) if lengths is not None and self.gives_sequence[index] else None)

    def train_batch(self, x, y, key: tuple = (0,), grads_ready=None):
        """Forward and backward (`grads_ready` as `backward`'s) on one batch; fills `grads`; returns (mean loss,
        correct predictions) as 0-d arrays on the model's device, so a step never waits for the host. An
        autoencoder's `y` is not read: its target is `x`."""
        if self.reconstruction:
            y = x.reshape(len(x), -1)
        logits = self.forward(x, training=True, key=key)
        if logits.ndim == 3:  # a class per step (docs/sequences.md): the loss over the valid steps alone
            logits_of_steps, classes, valid = valid_steps(logits, y)
            loss, correct, dsteps = self.loss_fn(logits_of_steps, classes, self.loss_ws)
            dlogits = self.loss_ws("step_gradients", logits.shape, logits.dtype)
            dlogits[...] = 0
            dlogits[valid] = dsteps
            self.backward(dlogits, grads_ready)
            return loss, correct * (len(y) / max(len(classes), 1))  # the steps' accuracy, counted in rows
        loss, correct, dlogits = self.loss_fn(logits, y, self.loss_ws)
        self.backward(dlogits, grads_ready)
        return loss, correct


class Sequential(Network):
    """Layers applied in order, a loss on the last layer's output, flat buffers for all parameters.

    A dense or conv2d layer's `activation` becomes a layer of its own right after it; the
    dense or conv2d layer then runs it fused with its bias add (`FusesActivation.fuse_activation`).
    Every array a step writes is in `workspace` (`mpitrain.base.workspace`), one part per layer
    (named like the layout, `03_dense`) and one for the loss. `loss_options` are the loss's
    (`mpitrain.nn.losses.LOSS_OPTIONS`: pos_weight, class_weights, delta).
    """

    def __init__(self, layers: list[Layer], input_shape: tuple[int, ...], loss: str = "softmax_cross_entropy",
                 xp=np, dtype="float32", loss_options: dict | None = None):
        layers, self.input_shape = _with_activation_layers(layers), tuple(input_shape)
        shapes, stat_shapes, shape = [], [], self.input_shape
        self.gives_sequence = []  # per layer: whether its output is a sequence (docs/sequences.md)
        for layer in layers:
            shapes.append(layer.param_shapes(shape))
            stat_shapes.append(layer.stat_shapes(shape))
            shape = layer.output_shape(shape)
            self.gives_sequence.append(is_sequence(shape))
        self.output_shape = shape
        names = [f"{index:02d}_{type(layer).__name__.lower()}" for index, layer in enumerate(layers)]
        super().__init__(layers, names, shapes, stat_shapes, loss, xp, dtype, loss_options)
        _fuse_activations(self.layers)

    def forward(self, x, training: bool = False, key: tuple = (0,), until: int | None = None):
        """The logits of `x`, or with `until` the output of layer `until` (an index into `layers`); `key` (seed, rank,
        epoch, step) seeds the step's random layers (dropout). `x` may be a `SequenceBatch`: each layer is told its
        input's lengths (`layer.lengths`) and gives its output's (`output_lengths`) while its output is a sequence."""
        x, lengths = (x.values, x.lengths) if isinstance(x, SequenceBatch) else (x, None)
        for index in range(len(self.layers) if until is None else until + 1):
            x, lengths = self.run_layer(index, x, lengths, training, key)
        return x

    def backward(self, dy, grads_ready=None) -> None:
        """Backpropagate down to the first layer with parameters that is not frozen; its input gradient is skipped,
        and the frozen layers below it are not run at all (a frozen layer above it still computes its parameters'
        gradient, in the same pass as its input's, which no one reads).

        After each layer, `grads_ready(start)` (if given) learns that `grads[start:]` are final:
        the layers fill the flat buffer from its end, so a synchronizer can send their part meanwhile.
        """
        first = next((i for i, layer in enumerate(self.layers) if layer.params and i not in self.frozen),
                     len(self.layers))
        for i in range(len(self.layers) - 1, first - 1, -1):
            dy = self.layers[i].backward(dy, input_grad=i > first)
            self.grads_done(i, grads_ready)

    def config_entries(self) -> dict:
        """The config keys that build this model again."""
        return {"model.layers": self.layer_specs(), "model.graph": []}

    def layer_specs(self) -> list[dict]:
        """`model.layers` of a config that builds this model again: `{type: NAME, **arguments}` per layer."""
        names = {cls: name for name, cls in LAYER_TYPES.items()}
        specs = []
        for layer in self.layers:
            if type(layer) not in names:
                raise ConfigError(f"a {type(layer).__name__} layer is not one of mpitrain's layer types "
                                  f"{sorted(LAYER_TYPES)}, so a run's config.yaml cannot name it")
            arguments = {name: _plain(getattr(layer, name)) for name in inspect.signature(type(layer)).parameters
                         if name != "activation"}  # activations are layers of their own by now
            specs.append({"type": names[type(layer)], **arguments, **({"freeze": True} if layer.frozen else {})})
        return specs


def valid_steps(logits, classes):
    """A step target's (logits (steps, C), classes (steps,), which steps) of the valid steps of a batch: `logits`
    (B, T, C) against `classes` (B, T), -1 at padded steps. A model whose output sequence is not as long as its
    input's (a strided conv1d) has no class per output step: a ValueError says so."""
    if classes.shape != logits.shape[:2]:
        raise ValueError(f"the model gives {logits.shape[1]} steps for {classes.shape[1]} steps of classes; a class "
                         "per step needs an output step per input step (no stride, no 'valid' padding, no cls_token)")
    valid = classes >= 0
    return logits[valid], classes[valid], valid


def estimated_size(shape: tuple, steps: int) -> int:
    """The numbers of one row of `shape`, a sequence's counted at `steps` steps (its longest)."""
    return math.prod(steps if d is None else d for d in shape)


def _with_activation_layers(layers: list[Layer]) -> list[Layer]:
    """`layers` with each layer's `activation` (if any) moved into an activation layer right after it."""
    expanded = []
    for layer in layers:
        expanded.append(layer)
        activation = getattr(layer, "activation", "none")
        if activation != "none":
            expanded.append(ACTIVATIONS[activation]())
            layer.activation = "none"
    return expanded


def _fuse_activations(layers: list[Layer]) -> None:
    """Let each layer that can (`FusesActivation`) run the activation layer right after it, which then passes
    through; an activation whose derivative needs its input (GELU, SiLU) always runs itself."""
    for layer, after in zip(layers, layers[1:]):
        if type(after) in ACTIVATIONS.values() and after.kind in KINDS and isinstance(layer, FusesActivation):
            layer.fuse_activation(after.kind)
            after.fused = True


def _layout(names: list[str], shapes: list[dict]) -> list:
    """[(name, shape)] in buffer order, each name `LAYER/array` (e.g. `00_dense/W`)."""
    return [(f"{layer}/{name}", tuple(s)) for layer, layer_shapes in zip(names, shapes)
            for name, s in layer_shapes.items()]


def _per_layer(views: list, shapes: list[dict]) -> list[dict]:
    """Regroup the flat list of views into one {name: view} per layer."""
    grouped, views = [], iter(views)
    for layer_shapes in shapes:
        grouped.append({name: next(views) for name in layer_shapes})
    return grouped


def _plain(value):
    """A YAML-safe value: tuples become lists."""
    return list(value) if isinstance(value, tuple) else value


def build_model(config, input_shape, num_classes: int, xp, outputs: str = "classes",
                budget: Budget | None = None, sequence: dict | None = None,
                per_step: bool = False) -> Sequential:
    """Build the model of `config.model` (a ModelConfig) for inputs of `input_shape`.

    Each layer is `{type: NAME, ...keyword arguments}`; a dense or conv2d layer's
    `activation` adds that activation layer after it. The last layer must give
    `num_classes` outputs (one per class, or per target column: `outputs` names them for the
    error). A layer that does not fit its input shape is named. With `budget` (rows per step, bytes a rank has),
    a model estimated to need more is refused before anything is allocated (`check_memory`). `sequence` is the
    manifest's entry of a sequence input `(None, F)`: its longest sequence sizes the estimate, its shortest must pass
    every layer (a `valid` conv1d shortens them), a `token_embedding` with `ids: auto` takes its `ids` (and must be
    the first layer: its ids get no gradient). With `per_step` (a class per step) the last layer must give a sequence
    of `num_classes` outputs per step.
    """
    sequence = sequence or {}
    steps, lengths = sequence.get("longest", 1), np.array([sequence.get("shortest", 1), sequence.get("longest", 1)])
    layers, shape, sizes = [], tuple(input_shape), [[], [estimated_size(input_shape, steps)]]
    for i, spec in enumerate(config.layers):
        made = _layer_from_spec(spec, f"model.layers[{i}]")
        if isinstance(made, TokenEmbedding):
            if i:
                raise ConfigError(f"model.layers[{i}] (token_embedding) reads the dataset's token ids, expected it "
                                  "as the first layer")
            made.ids = sequence.get("ids", "auto") if made.ids == "auto" else made.ids
        if isinstance(made, Positional) and made.max_steps == "auto" and sequence:
            made.max_steps = int(lengths[1])  # the longest sequence at its input (a [CLS] token adds a step)
        for layer in _with_activation_layers([made]):
            try:
                sizes[0] += [*layer.param_shapes(shape).values(), *layer.stat_shapes(shape).values()]
                if is_sequence(shape) and sequence:
                    lengths = layer.output_lengths(lengths)  # the shortest must keep a step; the longest
                shape = layer.output_shape(shape)
            except ValueError as e:
                raise ConfigError(f"model.layers[{i}] ({spec['type']}) on inputs of shape {list(shape)}: {e}") from None
            sizes[1].append(estimated_size(shape, steps))
            layers.append(layer)
    check_memory("model.layers", sum(map(math.prod, sizes[0])), sum(sizes[1]), np.dtype(config.dtype).itemsize, budget)
    model = Sequential(layers, input_shape, config.loss, xp, config.dtype, config.loss_options)
    expected = (None, num_classes) if per_step else (num_classes,)
    if model.output_shape != expected:
        raise ConfigError(f"model.layers: the last layer gives outputs of shape {list(model.output_shape)}, "
                          f"expected {list(expected)} for the dataset's {num_classes} {outputs}"
                          f"{' per step (None: a sequence)' if per_step else ''}")
    weights = config.loss_options.get("class_weights", [])
    if weights and len(weights) != num_classes:
        raise ConfigError(f"model.loss_options.class_weights has {len(weights)} weights, expected {num_classes}: "
                          "one per class of the dataset")
    return model


def rank_memory_bytes(ranks_on_node: int) -> int:
    """The bytes one rank may use: the node's physical memory, or less where a cgroup limits it
    (`cgroup_memory_limit`), shared equally by the `ranks_on_node` ranks on the node."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(total, cgroup_memory_limit() or total) // max(1, ranks_on_node)


def cgroup_memory_limit(own: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The least memory limit on this process's cgroup or any cgroup above it (`own` names them, mounted under
    `root`): v2's memory.max, v1's memory.limit_in_bytes; None where none is set. A container sees its own cgroup
    as the root; a Slurm step on a node without cgroup namespaces is in /slurm/uid_U/job_J/step_S, under its job's
    limit."""
    try:
        with open(own) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            folder, name = root, "memory.max"
        elif "memory" in controllers.split(","):
            folder, name = os.path.join(root, "memory"), "memory.limit_in_bytes"
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            try:
                with open(os.path.join(folder, *parts[:depth], name)) as f:
                    limit = f.read().strip()
            except OSError:
                continue
            if limit.isdigit():  # v2's "max": no limit
                limits.append(int(limit))
    return min(limits, default=None)


class Budget(typing.NamedTuple):
    """What a rank has for a model: `rows` per step, `bytes` of memory, the `ranks` a sharded table's rows are
    spread over, and the `copies` of the parameters training holds (`mpitrain.nn.updaters.state_copies`: 3 + the
    updater's slots + its L2 and weight decay arrays; 4 when the optimizer is not known)."""

    rows: int
    bytes: int
    ranks: int = 1
    copies: int = 4


AUTO_SHARD_SHARE = 0.25  # `shard: auto` shards tables whose training copies would take more of a rank's bytes


def auto_shard(tables: list, itemsize: int, budget: Budget | None) -> str:
    """`shard: auto`'s choice for a layer's `tables` ((rows, dim) each): `rows` on several ranks when the tables'
    copies in training (`Budget.copies`: values, gradients, the updater's) would take more than AUTO_SHARD_SHARE of
    a rank's bytes, else `none` (also without a budget: a model built outside a run)."""
    if budget is None or budget.ranks < 2:
        return "none"
    return "rows" if budget.copies * itemsize * sum(rows * dim for rows, dim in tables) > \
        AUTO_SHARD_SHARE * budget.bytes else "none"


def sharded_share(tables: list, ranks: int) -> int:
    """The values the rank with the most rows holds of sharded `tables` ((rows, dim) each) over `ranks` ranks."""
    return sum(-(-rows // ranks) * dim for rows, dim in tables)


def check_memory(key: str, params: int, activations: int, itemsize: int, budget: Budget | None) -> None:
    """Refuse a model whose estimated bytes exceed a rank's: `params` numbers `budget.copies` times (values,
    gradients, the updater's delta buffer, slots and L2 arrays; a sharded table's share of its rows on the rank:
    `sharded_share`) plus, per row of a step, its `activations` (input and every layer's output) twice (forward,
    backward); None checks nothing."""
    if budget is None:
        return
    rows, limit = budget.rows, budget.bytes
    estimate = itemsize * (budget.copies * params + 2 * rows * activations)
    if estimate > limit:
        raise ConfigError(f"{key}: the model needs about {estimate:,} bytes per rank ({params:,} parameters x "
                          f"{budget.copies} copies, {rows} rows x {activations:,} activations x 2), expected at most "
                          f"the {limit:,} bytes a rank has (the node's memory, or its cgroup limit, / the ranks on the "
                          "node)")


def check_layer_spec(spec, key: str) -> None:
    """Refuse a layer entry of a config (`{type: NAME, ...arguments}`) that names an unknown type or argument,
    or an argument value out of range, naming the key (e.g. `model.layers[2].units`) and what was expected."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(f"{key} is {spec!r}, expected a mapping with a 'type' key")
    cls = LAYER_TYPES.get(spec["type"])
    if cls is None:
        raise ConfigError(f"{key}.type is {spec['type']!r}, expected one of {sorted(LAYER_TYPES)}")
    check_freeze(spec, key)
    kwargs = {k: v for k, v in spec.items() if k not in SPEC_KEYS}
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{key}: {e} (a {spec['type']} layer takes {list(inspect.signature(cls).parameters)})") from None
    for name, value in kwargs.items():
        ok, expected = LAYER_ARGUMENTS[name]
        if not ok(value):
            raise ConfigError(f"{key}.{name} is {value!r}, expected {expected}")


# The keys of a layer entry that are not its type's arguments: the type, and whether its parameters are frozen
# (`freeze: true`: no gradient where avoidable, no step, no bytes in any sync mode; docs/recipes.md).
SPEC_KEYS = ("type", "freeze")

# Sane upper bounds of layer sizes: beyond them a config is a typo (a 16M-unit layer on 784 inputs alone is 50 GB),
# refused when the config is read; what is left is sized against a rank's memory by `check_memory`.
MAX_UNITS = 2**24
MAX_WINDOW = 1024


def _count(value, most: int = MAX_UNITS) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= most


def _window(value) -> bool:
    return _count(value, MAX_WINDOW) or isinstance(value, list) and len(value) == 2 and \
        all(_count(v, MAX_WINDOW) for v in value)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# Every layer argument a config may set, with the check it must pass and what is expected.
LAYER_ARGUMENTS = {
    "units": (_count, f"an integer in [1, {MAX_UNITS}]"),
    "filters": (_count, f"an integer in [1, {MAX_UNITS}]"),
    "ids": (lambda v: v == "auto" or _count(v, MAX_IDS), f"an integer in [1, {MAX_IDS}] or 'auto'"),
    "dim": (lambda v: v == "auto" or _count(v) or isinstance(v, list) and v and all(map(_count, v)),
            f"an integer in [1, {MAX_UNITS}], a list of them (one per column) or 'auto'"),
    "kernel": (_window, f"an integer in [1, {MAX_WINDOW}] or [height, width]"),
    "pool": (_window, f"an integer in [1, {MAX_WINDOW}] or [height, width]"),
    "stride": (lambda v: v is None or _count(v, MAX_WINDOW), f"an integer in [1, {MAX_WINDOW}]"),
    "dilation": (lambda v: _count(v, MAX_WINDOW), f"an integer in [1, {MAX_WINDOW}]"),
    # each layer checks its own paddings too: conv2d and the 2-D pools PADDINGS, conv1d SEQUENCE_PADDINGS
    "padding": (lambda v: v in PADDINGS or v in SEQUENCE_PADDINGS,
                f"one of {PADDINGS} (conv2d, pools) or {SEQUENCE_PADDINGS} (conv1d)"),
    "rate": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "momentum": (lambda v: _number(v) and 0 <= v < 1, "a number in [0, 1)"),
    "eps": (lambda v: _number(v) and v > 0, "a positive number"),
    "activation": (lambda v: v == "none" or v in ACTIVATIONS, f"'none' or one of {sorted(ACTIVATIONS)}"),
    "init": (lambda v: v is None or v in INIT_SCHEMES, f"one of {INIT_SCHEMES}"),
    "return_sequences": (lambda v: isinstance(v, bool), "true or false"),
    "encoding": (lambda v: v in ENCODINGS, f"one of {ENCODINGS}"),
    "heads": (lambda v: _count(v, MAX_WINDOW), f"an integer in [1, {MAX_WINDOW}]"),
    "causal": (lambda v: isinstance(v, bool), "true or false"),
    "norm_first": (lambda v: isinstance(v, bool), "true or false"),
    "ff_units": (_count, f"an integer in [1, {MAX_UNITS}]"),
    "max_steps": (lambda v: v == "auto" or _count(v, MAX_UNITS), f"an integer in [1, {MAX_UNITS}] or 'auto'"),
    "bidirectional": (lambda v: isinstance(v, bool), "true or false"),
    "shard": (lambda v: v in SHARDS, f"one of {SHARDS} (docs/tables.md)"),
}


def check_freeze(spec: dict, key: str) -> None:
    """Refuse a layer or node entry whose `freeze` is not true or false, naming `key`."""
    if not isinstance(spec.get("freeze", False), bool):
        raise ConfigError(f"{key}.freeze is {spec['freeze']!r}, expected true or false")


def _layer_from_spec(spec, key: str) -> Layer:
    check_layer_spec(spec, key)
    try:
        layer = LAYER_TYPES[spec["type"]](**{k: v for k, v in spec.items() if k not in SPEC_KEYS})
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    layer.frozen = spec.get("freeze", False)
    return layer
