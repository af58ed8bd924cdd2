"""Winograd's F(2x2, 3x3) kernels (kernels.winograd): the transforms put together are a 3x3 convolution, each
adjoint is its transform's adjoint (<T a, b> = <a, T' b>), float32 loses only roundings. A Winograd conv layer's step
allocating nothing is tested in test_conv_kernels.py, the layer against its im2col path in tests/unit/nn/test_conv.py."""
import numpy as np
import pytest

from mpitrain.kernels.im2col import geometry
from mpitrain.kernels.winograd import (
    padded_channels_last,
    padded_size,
    tiles,
    winograd_inputs,
    winograd_inputs_adjoint,
    winograd_outputs,
    winograd_outputs_adjoint,
    winograd_weights,
    winograd_weights_adjoint,
)

GEOMETRIES = [(3, 6, 6, "same"), (2, 7, 5, "same"), (4, 7, 9, "valid"), (1, 3, 3, "valid"), (2, 1, 2, "same")]


def transforms(shape, padding, rng):
    """Random inputs x (N, C, H, W), weights w (F, C, 3, 3), their geometry, tile count and padded image shape."""
    n, height, width = 2, shape[1], shape[2]
    g = geometry(shape, 3, 1, padding)
    x = rng.normal(size=(n, shape[0], height, width))
    w = rng.normal(size=(5, shape[0], 3, 3))
    return x, w, g, n * tiles(g)[0] * tiles(g)[1], (n, *padded_size(g), shape[0])


@pytest.mark.parametrize("channels,height,width,padding", GEOMETRIES)
def test_the_transforms_and_sixteen_products_are_a_3x3_convolution(channels, height, width, padding):
    rng = np.random.default_rng(1)
    x, w, g, tile_count, image_shape = transforms((channels, height, width), padding, rng)
    image, v, u = np.empty(image_shape), np.empty((16, tile_count, channels)), np.empty((16, channels, 5))
    padded_channels_last(x, g, image)
    winograd_inputs(image, g, v)
    winograd_weights(w, u)
    rows = np.empty((2, g.out_height, g.out_width, 5))
    winograd_outputs(np.matmul(v, u), rows)
    padded = np.zeros((2, channels, height + 4, width + 4))
    padded[:, :, g.pad_top:g.pad_top + height, g.pad_left:g.pad_left + width] = x
    expected = np.zeros((2, 5, g.out_height, g.out_width))
    for i in range(g.out_height):
        for j in range(g.out_width):
            expected[:, :, i, j] = np.einsum("nckl,fckl->nf", padded[:, :, i:i + 3, j:j + 3], w)
    np.testing.assert_allclose(rows.transpose(0, 3, 1, 2), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("channels,height,width,padding", GEOMETRIES)
def test_each_adjoint_is_the_adjoint_of_its_transform(channels, height, width, padding):
    rng = np.random.default_rng(2)
    x, w, g, tile_count, image_shape = transforms((channels, height, width), padding, rng)
    # inputs: x -> padded image -> V
    image, v = np.empty(image_shape), np.empty((16, tile_count, channels))
    padded_channels_last(x, g, image)
    winograd_inputs(image, g, v)
    dv, dx = rng.normal(size=v.shape), np.empty_like(x)
    winograd_inputs_adjoint(dv, g, np.empty(image_shape), dx)
    np.testing.assert_allclose(np.vdot(v, dv), np.vdot(x, dx), rtol=1e-12)
    # outputs: M -> rows
    m, rows = rng.normal(size=(16, tile_count, 5)), np.empty((2, g.out_height, g.out_width, 5))
    winograd_outputs(m, rows)
    drows, dm = rng.normal(size=rows.shape), np.empty_like(m)
    winograd_outputs_adjoint(drows, dm)
    np.testing.assert_allclose(np.vdot(rows, drows), np.vdot(m, dm), rtol=1e-12)
    # weights: w -> U
    u, du, dw = np.empty((16, channels, 5)), rng.normal(size=(16, channels, 5)), np.empty_like(w)
    winograd_weights(w, u)
    winograd_weights_adjoint(du, dw)
    np.testing.assert_allclose(np.vdot(u, du), np.vdot(w, dw), rtol=1e-12)


def test_the_padded_image_is_zero_around_the_input_whatever_was_in_it():
    rng = np.random.default_rng(3)
    x, _, g, _, image_shape = transforms((3, 5, 4), "same", rng)
    image = np.full(image_shape, np.nan)
    padded_channels_last(x, g, image)
    inside = image[:, g.pad_top:g.pad_top + 5, g.pad_left:g.pad_left + 4]
    np.testing.assert_array_equal(inside, x.transpose(0, 2, 3, 1))
    inside[...] = 0
    np.testing.assert_array_equal(image, 0)


def test_in_float32_the_transforms_lose_no_more_than_a_few_roundings():
    """32 channels of 28 x 28, as the residual net's: float32 Winograd within 1e-5 of the output's scale of float64."""
    rng = np.random.default_rng(4)
    x, w, g, tile_count, image_shape = transforms((32, 28, 28), "same", rng)
    outputs = []
    for dtype in (np.float64, np.float32):
        image, v, u = np.empty(image_shape, dtype), np.empty((16, tile_count, 32), dtype), np.empty((16, 32, 5), dtype)
        padded_channels_last(x.astype(dtype), g, image)
        winograd_inputs(image, g, v)
        winograd_weights(w.astype(dtype), u)
        rows = np.empty((2, 28, 28, 5), dtype)
        winograd_outputs(np.matmul(v, u), rows)
        outputs.append(rows)
    exact, single = outputs
    assert np.abs(single - exact).max() <= 1e-5 * np.abs(exact).max()
