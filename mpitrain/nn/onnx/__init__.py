"""A model's layers as ONNX nodes: one module per family of layers, each registering its layers' emitters.

| module | emits |
| --- | --- |
| `graph.py` | nothing: `OnnxGraph` (nodes and initializers under construction) and the `emits` registry |
| `dense.py` | dense, relu, tanh, sigmoid, gelu, gelu_tanh, silu, flatten, dropout |
| `conv.py` | conv2d, maxpool2d, avgpool2d |
| `batchnorm.py` | batchnorm, layernorm |
| `embedding.py` | a table's embedding, feature_tokens |
| `recurrent.py` | lstm, gru |
| `sequence.py` | conv1d, the global pools, token_embedding (masking padded steps), positional, cls_token, cls_pool |
| `attention.py` | attention (masking padded and, when causal, later keys), cross-attention, transformer |
| `network.py` | a model's layers or graph nodes, each by its emitter |

A new layer's emitter goes into its family's module (or a new module, imported below: its registration).
`mpitrain.rundir.export` builds the model's whole graph (inputs, scaling, head, metadata) around these.
"""
from __future__ import annotations

from mpitrain.nn.onnx import attention, batchnorm, conv, dense, embedding, recurrent, sequence  # noqa: F401 registers
from mpitrain.nn.onnx.graph import EMITTERS, OPSET, OnnxGraph, emits, require_onnx
from mpitrain.nn.onnx.network import check_exportable, emit_layer, emit_layers, emit_nodes

__all__ = ["EMITTERS", "OPSET", "OnnxGraph", "emits", "require_onnx", "check_exportable", "emit_layer",
           "emit_layers", "emit_nodes"]
