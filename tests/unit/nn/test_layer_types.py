"""The layer registries built from the layers: every layer class a config can name registers itself once, under the
name its own module gives it, and every one of them brings an ONNX emitter (a layer added without one is caught
here, not by a user's `mpitrain export`)."""
import inspect

import pytest

from mpitrain.nn import layers as layer_module
from mpitrain.nn.attention import CrossAttention
from mpitrain.nn.feature_tokens import FeatureTokensWithEmbeddings
from mpitrain.nn.layer_types import GRAPH_TYPES, LAYER_TYPES
from mpitrain.nn.merge import Add, Concat
from mpitrain.nn.onnx import EMITTERS


def test_every_registered_name_is_its_class_name_and_graph_only_types_stay_out_of_layers():
    assert all(cls.type_name == name for name, cls in GRAPH_TYPES.items())
    assert set(GRAPH_TYPES) - set(LAYER_TYPES) == {"embedding", "embedding_bag", "concat", "add"}
    assert list(LAYER_TYPES) == sorted(LAYER_TYPES)  # the reference page's order does not follow the imports


def test_every_concrete_layer_class_is_registered():
    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)
    concrete = {cls for cls in subclasses(layer_module.Layer)
                if not cls.__name__.startswith("_") and cls.__module__.startswith("mpitrain.nn")
                and "type_name" in vars(cls)}
    assert concrete == set(GRAPH_TYPES.values())
    unregistered = {cls.__name__ for cls in subclasses(layer_module.Layer)
                    if cls.__module__.startswith("mpitrain.nn") and not inspect.isabstract(cls)
                    and not cls.__name__.startswith("_") and cls.type_name is None}
    assert unregistered == {"FusesActivation", "Recurrent", "Merge", "TableLayer"}  # the bases no config names


def test_every_layer_type_but_the_merges_has_an_onnx_emitter():
    joined = {cls.joined_by for cls in GRAPH_TYPES.values() if cls.joined_by}  # a type's class over several inputs
    assert joined == {CrossAttention, FeatureTokensWithEmbeddings}
    assert set(EMITTERS) == set(GRAPH_TYPES.values()) - {Concat, Add} | joined  # the merges: the graph's own nodes


def test_a_second_registration_of_a_name_is_refused():
    with pytest.raises(AssertionError, match="two layer types named 'dense'"):
        layer_module.layer_type("dense")(type("Other", (layer_module.Layer,), {}))
