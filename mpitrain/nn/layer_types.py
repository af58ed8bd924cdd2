"""The layer types a config names, collected from the layers themselves.

    LAYER_TYPES["dense"]      # model.layers' types (and model.graph's): {name: Layer class}
    GRAPH_TYPES["embedding"]  # model.graph's: those, and the graph-only embedding, concat and add

Each layer class registers itself with `mpitrain.nn.layers.layer_type("NAME")` where it is defined; importing its
module here is its registration. A new layer type is its module plus one name in the import below (and, to be
exported, its ONNX emitter in `mpitrain.nn.onnx`). The registries are sorted by name, so the config's reference
page lists them in an order that does not depend on the imports.
"""
from __future__ import annotations

from mpitrain.nn import (  # noqa: F401 registers
    attention,
    batchnorm,
    cls_token,
    conv,
    embedding,
    embedding_bag,
    feature_tokens,
    layernorm,
    layers,
    merge,
    positional,
    recurrent,
    sequence,
    tokens,
    transformer,
)
from mpitrain.nn.layers import LAYER_CLASSES

GRAPH_TYPES = dict(sorted(LAYER_CLASSES.items()))
LAYER_TYPES = {name: cls for name, cls in GRAPH_TYPES.items() if not cls.graph_only}
