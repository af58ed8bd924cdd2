"""The PyTorch twin of an image model given as mpitrain's `model.graph` (benchmarks/torch_ddp.py builds it): each
node whose type is a layer (conv2d, batchnorm, activations, pooling, flatten, dense) is that layer's twin from
`torch_ddp.build_torch_model`, `add` sums its inputs, and the input node `numeric` is the batch of images. Nodes
run in the order the config lists them (mpitrain requires a node's inputs before it), the last node is the
output. This is what a PyTorch user writes for a residual net: a module per layer and the skip as a sum.
"""
from __future__ import annotations

import torch

MERGES = {"add"}


class GraphModel(torch.nn.Module):
    """`nodes` (the config's model.graph) on images of `input_shape` (C, H, W)."""

    def __init__(self, nodes: list[dict], input_shape: tuple[int, ...]):
        from torch_ddp import build_torch_model

        super().__init__()
        self.nodes = [(node["name"], node["type"], node.get("inputs") or [node["input"]]) for node in nodes]
        unsupported = {kind for _, kind, _ in self.nodes if kind in ("concat", "embedding")}
        if unsupported:
            raise ValueError(f"the PyTorch graph twin runs image graphs; not {sorted(unsupported)}")
        self.layers = torch.nn.ModuleDict()
        shapes = {"numeric": tuple(input_shape)}
        for node, (name, kind, inputs) in zip(nodes, self.nodes):
            if kind in MERGES:
                shapes[name] = shapes[inputs[0]]
                continue
            layer = {key: value for key, value in node.items() if key not in ("name", "input", "inputs")}
            self.layers[name] = build_torch_model([layer], shapes[inputs[0]])
            with torch.no_grad():
                shapes[name] = tuple(self.layers[name](torch.zeros(2, *shapes[inputs[0]])).shape[1:])

    def forward(self, x):
        values = {"numeric": x}
        for name, kind, inputs in self.nodes:
            if kind == "add":
                values[name] = sum(values[i] for i in inputs[1:]) + values[inputs[0]]
            else:
                values[name] = self.layers[name](values[inputs[0]])
        return values[self.nodes[-1][0]]
