"""Convolution, pooling, dropout and batch norm: layers against loops and finite differences, train/eval
behaviour (the convolution and pooling kernels against their references: test_conv_kernels.py)."""
import numpy as np
import pytest

import mpitrain.nn.conv as conv_module
from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import ModelConfig
from mpitrain.kernels.im2col import geometry
from mpitrain.nn.batchnorm import BatchNorm
from mpitrain.nn.conv import CHANNELS_LAST_FROM, WINOGRAD_FROM, AvgPool2D, Conv2D, MaxPool2D
from mpitrain.nn.layers import Dense, Dropout, Flatten, ReLU, Sigmoid, Tanh
from mpitrain.nn.model import Sequential, build_model
from mpitrain.testing.gradients import check_model_gradients


def test_same_padding_keeps_the_size_at_stride_one_and_divides_it_at_stride_two():
    assert (geometry((1, 28, 28), 5, 1, "same").out_height, geometry((1, 28, 28), 5, 1, "same").pad_top) == (28, 2)
    assert geometry((1, 7, 7), 3, 2, "same").out_height == 4
    assert geometry((1, 28, 28), 5, 1, "valid").out_height == 24
    with pytest.raises(ValueError, match="does not fit"):
        geometry((1, 3, 3), 5, 1, "valid")


def direct_convolution(x, w, b, stride, pads):
    """Loop convolution (cross-correlation, as every DL framework) of NCHW `x` with FCKK `w`."""
    n, c, h, wd = x.shape
    f, _, kh, kw = w.shape
    padded = np.zeros((n, c, h + 2 * kh, wd + 2 * kw))
    padded[:, :, pads[0]:pads[0] + h, pads[1]:pads[1] + wd] = x
    oh, ow = (h + 2 * pads[0] - kh) // stride + 1, (wd + 2 * pads[1] - kw) // stride + 1
    out = np.zeros((n, f, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = padded[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nckl,fckl->nf", patch, w) + b
    return out


@pytest.mark.parametrize("channels", [2, CHANNELS_LAST_FROM])  # windows channels first, channels last
@pytest.mark.parametrize("stride,padding", [(1, "valid"), (2, "same"), (1, "same")])
def test_conv_forward_equals_a_direct_convolution(stride, padding, channels):
    rng = np.random.default_rng(2)
    model = Sequential([Conv2D(4, 3, stride, padding), Flatten()], (channels, 7, 7), "softmax_cross_entropy", np,
                       "float64")
    model.params[...] = rng.normal(size=model.n_params)
    conv = model.layers[0]
    assert conv.channels_last == (channels >= CHANNELS_LAST_FROM)
    x = rng.normal(size=(3, channels, 7, 7))
    expected = direct_convolution(x, conv.params["W"], conv.params["b"], stride, (conv.g.pad_top, conv.g.pad_left))
    np.testing.assert_allclose(conv.forward(x, training=True), expected[:, :, :conv.g.out_height, :conv.g.out_width])


def assert_same_step(got, expected):
    """A conv layer's (output, gradients, input gradient or None) equal another run's within 1e-12."""
    for name, a, b in zip(["output", "gradients", "input gradient"], got, expected):
        if b is None:
            assert a is None, name
        else:
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("channels", [2, CHANNELS_LAST_FROM])  # windows channels first, channels last
@pytest.mark.parametrize("input_grad", [True, False])
def test_a_conv_layer_in_chunks_of_images_equals_it_on_the_whole_batch(monkeypatch, channels, input_grad):
    """Windows past WHOLE_WINDOWS_UP_TO bytes go in chunks of about CHUNK_WINDOWS bytes (here 2 images of 5: chunks
    of 2, 2 and 1); forward, the bias's, weights' and input's gradients are the whole batch's."""
    rng = np.random.default_rng(12)
    x, dy = rng.normal(size=(5, channels, 6, 7)), rng.normal(size=(5, 3, 6, 7))
    monkeypatch.setattr(conv_module, "WINOGRAD_FROM", 1 << 30)  # im2col's windows; Winograd's chunks: below
    results = []
    for whole_up_to in (1 << 30, 0):
        monkeypatch.setattr(conv_module, "WHOLE_WINDOWS_UP_TO", whole_up_to)
        model = Sequential([Conv2D(3, 3, padding="same"), Flatten()], (channels, 6, 7), "softmax_cross_entropy", np,
                           "float64")
        model.params[...] = np.random.default_rng(13).normal(size=model.n_params)
        conv = model.layers[0]
        conv.fuse_activation("tanh")
        monkeypatch.setattr(conv_module, "CHUNK_WINDOWS", 2 * 6 * 7 * 9 * channels * 8 + 7)
        y = conv.forward(x, training=True).copy()
        dx = conv.backward(dy, input_grad=input_grad)
        results.append((len(conv.chunks(x)), y, model.grads.copy(), None if dx is None else dx.copy()))
    (whole, *expected), (chunks, *got) = results
    assert (whole, chunks) == (1, 3)
    assert_same_step(got, expected)


@pytest.mark.parametrize("layer,reduce", [(MaxPool2D, np.max), (AvgPool2D, np.mean)])
def test_pooling_forward_equals_a_loop(layer, reduce):
    rng = np.random.default_rng(3)
    pool = layer(2)
    pool.output_shape((2, 6, 6))
    x = rng.normal(size=(2, 2, 6, 6))
    expected = np.array([[[[reduce(x[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2]) for j in range(3)] for i in range(3)]
                          for c in range(2)] for n in range(2)])
    np.testing.assert_allclose(pool.forward(x, training=True), expected)


def test_max_pooling_sends_the_gradient_to_one_element_of_a_tied_window():
    pool = MaxPool2D(2)
    pool.output_shape((1, 2, 2))
    pool.forward(np.zeros((1, 1, 2, 2)), training=True)  # ReLU outputs tie at 0 all the time
    dx = pool.backward(np.ones((1, 1, 1, 1)))
    assert dx.sum() == 1 and dx[0, 0, 0, 0] == 1


def test_max_pooling_with_same_padding_never_picks_the_padding():
    pool = MaxPool2D(3, stride=2, padding="same")
    pool.output_shape((1, 4, 4))
    y = pool.forward(-np.ones((1, 1, 4, 4)) - np.arange(16).reshape(1, 1, 4, 4), training=True)
    assert (y <= -1).all()


@pytest.mark.parametrize("stride,padding", [(1, "valid"), (2, "same"), (2, "valid")])
@pytest.mark.parametrize("kind,activation", [("relu", ReLU), ("sigmoid", Sigmoid), ("tanh", Tanh)])
def test_conv_gradients_with_each_fused_activation(stride, padding, kind, activation):
    layers = [Conv2D(3, 3, stride, padding), activation(), Flatten(), Dense(3)]
    check_model_gradients(layers, (2, 5, 7), n=3)
    assert layers[0].kind == kind  # the conv layer ran the activation


@pytest.mark.parametrize("stride,padding", [(1, "same"), (2, "valid")])
def test_conv_gradients_with_windows_channels_last_below_another_conv(monkeypatch, stride, padding):
    """The second layer sees CHANNELS_LAST_FROM channels: its weights' and input's gradients go through the
    channels-last windows and the weights' copy in their order (im2col: Winograd would take the 3x3 of stride 1)."""
    monkeypatch.setattr(conv_module, "WINOGRAD_FROM", 1 << 30)
    layers = [Conv2D(CHANNELS_LAST_FROM, 3, padding="same"), Conv2D(3, 3, stride, padding), ReLU(), Flatten(), Dense(3)]
    check_model_gradients(layers, (1, 5, 6), n=2)
    assert [layer.channels_last for layer in layers[:2]] == [False, True]


@pytest.mark.parametrize("layer", [MaxPool2D(2), AvgPool2D(2), MaxPool2D(3, stride=2, padding="same"),
                                   AvgPool2D(2, stride=1)])
def test_pooling_gradients(layer):
    check_model_gradients([Conv2D(2, 3), layer, Flatten(), Dense(3)], (1, 7, 7), n=3)


def test_batchnorm_gradients_dense_and_conv():
    check_model_gradients([Dense(5), BatchNorm(), Tanh(), Dense(3)], (4,), n=6)
    check_model_gradients([Conv2D(3, 3, padding="same"), BatchNorm(), ReLU(), Flatten(), Dense(3)], (1, 4, 4), n=4)


@pytest.mark.parametrize("activation", [Tanh, ReLU])
def test_batchnorm_runs_the_activation_after_it_and_has_its_gradients(activation):
    """The activation layer after a batch norm runs inside it (its `kind`), dense and conv: the gradients are
    numeric ones, and the output is the activation of the batch norm's own."""
    rng = np.random.default_rng(4)
    for layers, shape in (([Dense(5), BatchNorm(), activation(), Dense(3)], (4,)),
                          ([Conv2D(3, 3, padding="same"), BatchNorm(), activation(), Flatten(), Dense(3)], (1, 4, 4))):
        check_model_gradients(layers, shape, n=6)
        model = Sequential(layers, shape, "softmax_cross_entropy", np, "float64")
        model.params[...] = rng.normal(size=model.n_params)
        norm, x = layers[1], rng.normal(size=(6, *shape))
        assert norm.kind == activation.kind and layers[2].fused
        fused = model.forward(x, until=2).copy()
        norm.fuse_activation("none")
        np.testing.assert_allclose(fused, activation().forward(model.forward(x, until=1), training=False))


def test_dropout_gradient_uses_the_same_mask():
    check_model_gradients([Dense(6), Dropout(0.5), Dense(3)], (4,), n=5)


def test_dropout_drops_a_fraction_in_training_only_and_its_mask_follows_the_key():
    drop = Dropout(0.3)
    x = np.ones((200, 50), np.float32)
    drop.key = (7, 0, 1, 5, 2)
    y = drop.forward(x, training=True).copy()  # the next forward reuses the layer's output array
    assert abs((y == 0).mean() - 0.3) < 0.02
    np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)  # the expectation is kept
    np.testing.assert_array_equal(drop.forward(x, training=True), y)  # same key, same mask
    drop.key = (7, 1, 1, 5, 2)  # another rank
    assert (drop.forward(x, training=True) != y).any()
    np.testing.assert_array_equal(drop.forward(x, training=False), x)
    np.testing.assert_array_equal(drop.backward(np.ones_like(x)), np.ones_like(x))


def test_batchnorm_normalizes_in_training_and_uses_running_statistics_in_evaluation():
    rng = np.random.default_rng(4)
    model = Sequential([BatchNorm(momentum=0.5), Flatten(), Dense(2)], (3, 4, 4), "softmax_cross_entropy", np)
    model.init_params(0, "xavier")
    bn = model.layers[0]
    x = (rng.normal(size=(16, 3, 4, 4)) * [[[2.0]], [[0.5]], [[1.0]]] + [[[3.0]], [[-1.0]], [[0.0]]]).astype(np.float32)
    y = bn.forward(x, training=True)
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(y.var(axis=(0, 2, 3)), 1, atol=1e-3)
    np.testing.assert_allclose(bn.stats["mean"], 0.5 * x.mean(axis=(0, 2, 3)), rtol=1e-5)
    m = 16 * 16
    np.testing.assert_allclose(bn.stats["var"], 0.5 + 0.5 * x.var(axis=(0, 2, 3)) * m / (m - 1), rtol=1e-5)
    evaluated = bn.forward(x, training=False)
    expected = (x - bn.stats["mean"].reshape(1, 3, 1, 1)) / np.sqrt(bn.stats["var"].reshape(1, 3, 1, 1) + bn.eps)
    np.testing.assert_allclose(evaluated, expected, rtol=1e-5, atol=1e-5)
    assert model.stats.size == 6 and [name for name, _ in model.stats_layout] == ["00_batchnorm/mean",
                                                                                   "00_batchnorm/var"]


def test_weights_of_conv_and_dense_decay_but_biases_and_batchnorm_scales_do_not():
    model = Sequential([Conv2D(2, 3), BatchNorm(), Flatten(), Dense(3)], (1, 5, 5), "softmax_cross_entropy", np)
    expected = np.concatenate([np.ones(18), np.zeros(2), np.zeros(4), np.ones(18 * 3), np.zeros(3)])
    np.testing.assert_array_equal(model.decay_mask, expected)


def lenet_config(overrides=None):
    layers = [{"type": "conv2d", "filters": 4, "kernel": 5, "activation": "relu"}, {"type": "maxpool2d", "pool": 2},
              {"type": "flatten"}, {"type": "dense", "units": 3}]
    return ModelConfig(layers=[{**layer, **(overrides or {}).get(i, {})} for i, layer in enumerate(layers)])


def test_build_model_makes_conv_nets_and_names_the_layer_that_does_not_fit():
    model = build_model(lenet_config(), (1, 12, 12), 3, np)
    assert model.output_shape == (3,) and model.layout[0] == ("00_conv2d/W", (4, 1, 5, 5))
    with pytest.raises(ConfigError, match=r"model.layers\[0\] \(conv2d\) on inputs of shape \[1, 4, 4\].*does not fit"):
        build_model(lenet_config(), (1, 4, 4), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[0\].*takes images"):
        build_model(lenet_config(), (144,), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[1\].padding is 'full', expected one of"):
        build_model(lenet_config({1: {"padding": "full"}}), (1, 12, 12), 3, np)
    with pytest.raises(ConfigError, match=r"model.layers\[0\].*missing a required argument: 'filters'"):
        build_model(ModelConfig(layers=[{"type": "conv2d", "filter": 3, "kernel": 3}]), (1, 8, 8), 3, np)


def conv_step(x, dy, kind, padding, input_grad=True):
    """A float64 conv2d layer of 3 3x3 filters (fused `kind`) on `x`: its output, gradients and input gradient, and
    whether it ran Winograd and in how many chunks."""
    model = Sequential([Conv2D(3, 3, padding=padding), Flatten()], x.shape[1:], "softmax_cross_entropy", np,
                       "float64")
    model.params[...] = np.random.default_rng(5).normal(size=model.n_params)
    conv = model.layers[0]
    conv.fuse_activation(kind)
    y = conv.forward(x, training=True).copy()
    dx = conv.backward(dy, input_grad=input_grad)
    return y, model.grads.copy(), None if dx is None else dx.copy(), conv.winograd, len(conv.batch)


@pytest.mark.parametrize("chunk_tiles", [1 << 30, 0])  # the batch in one chunk; a chunk per image
@pytest.mark.parametrize("shape,padding", [((8, 6, 7), "same"), ((9, 7, 5), "valid"), ((8, 3, 3), "same")])
@pytest.mark.parametrize("kind,input_grad", [("relu", True), ("tanh", True), ("none", False)])
def test_a_winograd_conv_layer_equals_its_im2col_path(monkeypatch, chunk_tiles, shape, padding, kind, input_grad):
    """3x3 of stride 1 over WINOGRAD_FROM channels or more: Winograd's F(2x2, 3x3) on the CPU; its output and
    every gradient are im2col's, on odd sizes too (a tile's row or column past the output dropped)."""
    rng = np.random.default_rng(21)
    x = rng.normal(size=(3, *shape))
    monkeypatch.setattr(conv_module, "CHUNK_TILES", chunk_tiles)
    out_shape = geometry(shape, 3, 1, padding)
    dy = rng.normal(size=(3, 3, out_shape.out_height, out_shape.out_width))
    *got, winograd, chunks = conv_step(x, dy, kind, padding, input_grad)
    assert winograd and chunks == (1 if chunk_tiles else 3)
    monkeypatch.setattr(conv_module, "WINOGRAD_FROM", 1 << 30)
    *expected, winograd, _ = conv_step(x, dy, kind, padding, input_grad)
    assert not winograd
    assert_same_step(got, expected)


def test_only_3x3_convolutions_of_stride_1_over_enough_channels_take_winograd():
    x = np.zeros((2, WINOGRAD_FROM, 9, 9))
    def takes(layer, batch=x):
        layer.param_shapes(batch.shape[1:])
        return layer.winograd_for(batch)
    assert takes(Conv2D(4, 3, padding="same")) and takes(Conv2D(4, 3)) and takes(Conv2D(4, (3, 3)))
    assert not takes(Conv2D(4, 3, stride=2)) and not takes(Conv2D(4, 5)) and not takes(Conv2D(4, (3, 1)))
    assert not takes(Conv2D(4, 3), np.zeros((2, WINOGRAD_FROM - 1, 9, 9)))


def test_conv_gradients_through_winograd_below_another_conv():
    layers = [Conv2D(WINOGRAD_FROM, 3, padding="same"), Conv2D(3, 3, 1, "same"), ReLU(), Flatten(), Dense(3)]
    check_model_gradients(layers, (1, 5, 6), n=2)
    assert [layer.winograd for layer in layers[:2]] == [False, True]
