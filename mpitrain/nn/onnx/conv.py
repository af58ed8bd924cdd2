"""ONNX emitters of the image layers: conv2d and the 2-D pools."""
from __future__ import annotations

from mpitrain.nn.conv import AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.onnx.graph import emits


def _pads(g) -> list[int]:
    """ONNX pads [top, left, bottom, right] of a `kernels.im2col.Geometry`: its own top and left, and at the
    bottom and right exactly what its last window reaches past the image (none for `valid`)."""
    (kh, kw), s = g.kernel, g.stride
    return [g.pad_top, g.pad_left, max((g.out_height - 1) * s + kh - g.height - g.pad_top, 0),
            max((g.out_width - 1) * s + kw - g.width - g.pad_left, 0)]


@emits(Conv2D)
def conv2d(graph, layer, x, name, input_shape):
    g = layer.g
    return graph.node("Conv", [x, graph.constant(f"{name}/W", layer.params["W"]),
                               graph.constant(f"{name}/b", layer.params["b"])], name,
                      kernel_shape=list(g.kernel), strides=[g.stride, g.stride], pads=_pads(g))


def _pool(op: str, **attributes):
    def emit(graph, layer, x, name, input_shape):
        g = layer.g
        return graph.node(op, [x], name, kernel_shape=list(g.kernel), strides=[g.stride, g.stride], pads=_pads(g),
                          **attributes)
    return emit


emits(MaxPool2D)(_pool("MaxPool"))
emits(AvgPool2D)(_pool("AveragePool", count_include_pad=1))
