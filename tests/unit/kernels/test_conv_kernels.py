"""The convolution and pooling kernels (kernels.im2col, kernels.pool, kernels.conv_rows) against their
references, on odd sizes, batch 1 and strided views; and a conv (im2col or Winograd) or pooling layer's step allocates
nothing."""

import numpy as np
import pytest

import mpitrain.nn.conv as conv_module
from mpitrain.kernels.activations import KINDS
from mpitrain.kernels.conv_rows import (
    activation_backward_rows,
    activation_backward_rows_reference,
    bias_activation_nchw,
    bias_activation_nchw_reference,
)
from mpitrain.kernels.im2col import (
    col2im,
    col2im_channels_last,
    col2im_channels_last_reference,
    col2im_reference,
    geometry,
    im2col,
    im2col_channels_last,
    im2col_channels_last_reference,
    im2col_reference,
)
from mpitrain.kernels.pool import max_pool, max_pool_backward, max_pool_backward_reference, max_pool_reference
from mpitrain.nn.conv import AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.layers import Flatten
from mpitrain.nn.model import Sequential
from mpitrain.testing.traced import allocated_bytes

GEOMETRIES = [  # (input C, H, W), kernel, stride, padding
    ((1, 6, 6), 3, 1, "valid"),
    ((2, 5, 7), 3, 2, "same"),
    ((2, 5, 7), 3, 2, "valid"),
    ((3, 5, 8), (2, 3), 2, "valid"),
    ((2, 4, 4), 5, 1, "same"),  # kernel larger than the image
    ((1, 9, 9), 2, 3, "valid"),  # stride past the kernel: some pixels in no window
]
POOLS = [  # (input C, H, W), pool, stride, padding
    ((3, 6, 6), 2, 2, "valid"),  # 2 x 2 side by side (kernels.pool.side_by_side_pairs)
    ((2, 7, 5), 2, 2, "valid"),  # side by side, an odd last row and column in no window
    ((2, 5, 7), 2, 2, "same"),  # the last windows reach past the image: not side by side inside
    ((2, 5, 7), 3, 2, "same"),  # overlapping windows
    ((1, 5, 5), 2, 1, "valid"),  # overlapping windows
    ((2, 7, 5), 3, 3, "valid"),  # pixels in no window
]
BATCHES = [(1, False), (3, True)]  # (batch size, a strided view as input)
DTYPES = [np.float32, np.float64]


def strided(array):
    """`array`'s values in a view that is neither C- nor F-contiguous: every other element of a transposed buffer."""
    buffer = np.zeros((*array.shape[::-1], 2), array.dtype)
    view = buffer[..., 0].transpose()
    view[...] = array
    return view


def batch(rng, shape, dtype, is_strided: bool):
    x = rng.normal(size=shape).astype(dtype)
    return strided(x) if is_strided else x


def each_batch_and_dtype(test):
    """Run `test` for every batch (size, strided or not) and every dtype."""
    return pytest.mark.parametrize("n,is_strided", BATCHES)(pytest.mark.parametrize("dtype", DTYPES)(test))


def tolerance(dtype):
    return {"rtol": 1e-5, "atol": 1e-6} if dtype == np.float32 else {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize("shape,kernel,stride,padding", GEOMETRIES)
@each_batch_and_dtype
def test_im2col_and_col2im_kernels_equal_the_reference(shape, kernel, stride, padding, n, is_strided, dtype):
    rng = np.random.default_rng(0)
    g = geometry(shape, kernel, stride, padding)
    x = batch(rng, (n, *shape), dtype, is_strided)
    for fill in (0.0, -np.inf):
        cols, expected = np.full((2, n, *g.cols_shape), np.nan, dtype)
        im2col(x, g, fill, cols)
        im2col_reference(x, g, fill, expected)
        np.testing.assert_array_equal(cols, expected)
    dcols = batch(rng, cols.shape, dtype, is_strided)
    dx, expected = np.full((2, n, *shape), np.nan, dtype)
    col2im(dcols, g, dx)
    col2im_reference(dcols, g, expected)
    np.testing.assert_allclose(dx, expected, **tolerance(dtype))


@pytest.mark.parametrize("shape,kernel,stride,padding", GEOMETRIES)
@each_batch_and_dtype
def test_channels_last_windows_are_the_windows_reordered_and_their_adjoint_the_reference(
        shape, kernel, stride, padding, n, is_strided, dtype):
    rng = np.random.default_rng(3)
    g = geometry(shape, kernel, stride, padding)
    x = batch(rng, (n, *shape), dtype, is_strided)
    windows, expected = np.full((2, n, g.out_height, g.out_width, *g.kernel, g.channels), np.nan, dtype)
    image = np.full((n, g.height, g.width, g.channels), np.nan, dtype)
    im2col_channels_last(x, g, image, windows)
    im2col_channels_last_reference(x, g, image, expected)
    np.testing.assert_array_equal(windows, expected)
    channels_first = np.empty((n, *g.cols_shape), dtype)
    im2col(x, g, 0.0, channels_first)
    np.testing.assert_array_equal(windows, channels_first.transpose(0, 1, 2, 4, 5, 3))
    dcols = batch(rng, windows.shape, dtype, is_strided)
    dx, expected = np.full((2, n, *shape), np.nan, dtype)
    col2im_channels_last(dcols, g, np.full_like(image, np.nan), dx)
    col2im_channels_last_reference(dcols, g, image, expected)
    np.testing.assert_allclose(dx, expected, **tolerance(dtype))


@pytest.mark.parametrize("shape,kernel,stride,padding", GEOMETRIES)
def test_col2im_is_the_adjoint_of_im2col(shape, kernel, stride, padding):
    rng = np.random.default_rng(1)
    g = geometry(shape, kernel, stride, padding)
    x, c = rng.normal(size=(2, *shape)), rng.normal(size=(2, *g.cols_shape))
    cols, dx = np.empty_like(c), np.empty_like(x)
    im2col(x, g, 0.0, cols)
    col2im(c, g, dx)
    assert np.isclose((cols * c).sum(), (x * dx).sum())


@pytest.mark.parametrize("shape,pool,stride,padding", POOLS)
@each_batch_and_dtype
def test_max_pool_kernels_equal_the_reference(shape, pool, stride, padding, n, is_strided, dtype):
    rng = np.random.default_rng(5)
    g = geometry(shape, pool, stride, padding)
    x = rng.normal(size=(n, *shape)).astype(dtype)
    x[0, 0] = 0  # ties everywhere
    x = strided(x) if is_strided else x
    y, expected = np.full((2, n, g.channels, g.out_height, g.out_width), np.nan, dtype)
    where, where_expected = np.full((2, *y.shape), -1, np.int32)
    max_pool(x, g, y, where)
    max_pool_reference(x, g, expected, where_expected)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(where, where_expected)
    dy = batch(rng, y.shape, dtype, is_strided)
    dx, expected = np.full((2, *x.shape), np.nan, dtype)
    max_pool_backward(dy, where, g, dx)
    max_pool_backward_reference(dy, where, g, expected)
    np.testing.assert_allclose(dx, expected, **tolerance(dtype))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n,is_strided", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_conv_rows_kernels_equal_the_reference(kind, n, is_strided, dtype):
    rng = np.random.default_rng(6)
    f, oh, ow = 5, 3, 7
    rows, b = batch(rng, (n * oh * ow, f), dtype, is_strided), rng.normal(size=f).astype(dtype)
    y, expected = np.full((2, n, f, oh, ow), np.nan, dtype)
    bias_activation_nchw(rows, b, kind, y)
    bias_activation_nchw_reference(rows, b, kind, expected)
    np.testing.assert_allclose(y, expected, **tolerance(dtype))
    dy = rng.normal(size=(n, oh, ow, f)).astype(dtype).transpose(0, 3, 1, 2)  # NHWC memory seen as NCHW
    dz, expected = np.full((2, n * oh * ow, f), np.nan, dtype)
    sums, sums_expected = np.full((2, n, f), np.nan)
    activation_backward_rows(dy, y, kind, dz, sums)
    activation_backward_rows_reference(dy, y, kind, expected, sums_expected)
    np.testing.assert_allclose(dz, expected, **tolerance(dtype))
    np.testing.assert_allclose(sums, sums_expected, **tolerance(dtype))


def assert_step_allocates_nothing(layer, x, dy):
    """`layer`'s forward of `x` and backward of `dy` allocate no more than 4 KB of traced memory (numpy's
    arrays included) once they have run once."""
    def step():
        layer.forward(x, training=True)
        layer.backward(dy)
    assert allocated_bytes(step) <= 4096


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunked", [False, True])  # the whole batch; a chunk per image (`Conv2D.chunks`)
@pytest.mark.parametrize("stride", [2, 1])  # im2col's windows; Winograd's tiles (3x3 of stride 1)
def test_a_conv_step_allocates_nothing_once_its_workspace_is_made(monkeypatch, kind, chunked, stride):
    """Every array is over 4 KB (W: 16 x 72 floats), so a copy of any, a transposed W's included, would show."""
    monkeypatch.setattr(conv_module, "CHUNK_TILES", 0 if chunked else 1 << 30)
    if chunked:
        monkeypatch.setattr(conv_module, "WHOLE_WINDOWS_UP_TO", 0)
        monkeypatch.setattr(conv_module, "CHUNK_WINDOWS", 0)
    model = Sequential([Conv2D(16, 3, stride, "same"), Flatten()], (8, 13, 11), "softmax_cross_entropy", np,
                       "float32")
    model.init_params(0, "xavier")
    conv = model.layers[0]
    conv.fuse_activation(kind)
    rng = np.random.default_rng(7)
    x = rng.normal(size=(4, 8, 13, 11)).astype(np.float32)
    dy = rng.normal(size=(4, 16, *model.layers[0].output_shape(x.shape[1:])[1:])).astype(np.float32)
    assert len(conv.chunks(x)) == (4 if chunked else 1) and conv.winograd_for(x) == (stride == 1)
    assert_step_allocates_nothing(conv, x, dy)


@pytest.mark.parametrize("layer", [MaxPool2D(2), MaxPool2D(3, stride=2, padding="same"), AvgPool2D(2),
                                   AvgPool2D(3, stride=2, padding="same")])
def test_a_pooling_step_allocates_nothing_once_its_workspace_is_made(layer):
    layer.output_shape((4, 13, 11))
    rng = np.random.default_rng(8)
    x = rng.normal(size=(8, 4, 13, 11)).astype(np.float32)
    dy = rng.normal(size=(8, layer.g.channels, layer.g.out_height, layer.g.out_width)).astype(np.float32)
    assert_step_allocates_nothing(layer, x, dy)
