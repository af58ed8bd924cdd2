"""The fused kernels of the layers, the loss, batch norm and the batch pipeline equal their plain references
(values; masks and hashes bit for bit), on odd sizes, batch 1 and non-contiguous inputs; the workspace hands out
the same arrays; the allocation trace sees an array made inside a span."""
import numpy as np
import pytest

from mpitrain.base.workspace import Workspace
from mpitrain.kernels import activations, batchnorm, elementwise_loss, loss, rows
from mpitrain.nn.layers import Dropout, keyed_bits
from mpitrain.training.allocations import AllocationTrace

SHAPES = [(1, 1), (1, 7), (5, 3), (33, 17), (64, 500)]
DTYPES = [np.float32, np.float64]


def operand(rng, shape, dtype, contiguous):
    """A random array of `shape`; a strided view of a larger one when not `contiguous`."""
    if contiguous:
        return rng.normal(size=shape).astype(dtype)
    return rng.normal(size=(shape[0], 2 * shape[1] + 1)).astype(dtype)[:, 1::2]


def close(dtype):
    return {"rtol": 1e-6 if dtype == np.float32 else 1e-13, "atol": 1e-7 if dtype == np.float32 else 1e-15}


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", list(activations.KINDS))
def test_bias_activation_and_its_backward_equal_the_reference(kind, shape, dtype, contiguous):
    rng = np.random.default_rng(sum(shape))
    z, dy = operand(rng, shape, dtype, contiguous), operand(rng, shape, dtype, contiguous)
    for b in (rng.normal(size=shape[1]).astype(dtype), z[0, :0]):  # with a bias, without
        y, expected = np.empty(shape, dtype), np.empty(shape, dtype)
        activations.bias_activation(z, b, kind, y)
        activations.bias_activation_reference(z, b, kind, expected)
        np.testing.assert_allclose(y, expected, **close(dtype))
        dz, expected_dz = np.empty(shape, dtype), np.empty(shape, dtype)
        activations.activation_backward(dy, y, kind, dz)
        activations.activation_backward_reference(dy, y, kind, expected_dz)
        np.testing.assert_allclose(dz, expected_dz, **close(dtype))


def test_bias_activation_may_write_over_its_input():
    z = np.linspace(-2, 2, 12).reshape(3, 4)
    expected = np.maximum(z + 1, 0)
    activations.bias_activation(z, np.ones(4), "relu", z)
    np.testing.assert_array_equal(z, expected)


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("shape", SHAPES)
def test_dropout_draws_the_reference_mask_bit_for_bit(shape, contiguous):
    rng = np.random.default_rng(7)
    x = operand(rng, shape, np.float32, contiguous)
    seed, threshold = np.uint64(0x1234_5678_9ABC_DEF0), 2**23
    out, mask = np.empty(shape, np.float32), np.empty(shape, np.float32)
    activations.dropout(x, seed, threshold, 2.0, out, mask)
    expected_out, expected_mask = np.empty(shape, np.float32), np.empty(shape, np.float32)
    activations.dropout_reference(x, seed, threshold, 2.0, expected_out, expected_mask)
    np.testing.assert_array_equal(mask, expected_mask)
    np.testing.assert_array_equal(out, expected_out)


def test_the_dropout_layer_drops_the_units_keyed_bits_name():
    drop = Dropout(0.25)
    drop.key = (3, 1, 4, 1, 5)
    x = np.ones((9, 13), np.float32)
    y = drop.forward(x, training=True)
    keep = keyed_bits(np, drop.key, x.shape) >= np.uint64(2**24 // 4)
    np.testing.assert_array_equal(y != 0, keep)


@pytest.mark.parametrize("contiguous", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 10), (7, 3), (64, 10), (300, 10)])
def test_softmax_cross_entropy_and_score_equal_the_reference(shape, dtype, contiguous):
    rng = np.random.default_rng(shape[0])
    logits = operand(rng, shape, dtype, contiguous) * 4
    logits[0, :2] = logits[0, :2].max() + 1  # a tie: the first largest is the prediction
    labels = rng.integers(0, shape[1], size=shape[0]).astype(np.int32)
    grad, totals = np.empty(shape, dtype), np.empty(2)
    loss.softmax_cross_entropy(logits, labels, grad, totals)
    expected_grad, expected = np.empty(shape, dtype), np.empty(2)
    loss.softmax_cross_entropy_reference(logits, labels, expected_grad, expected)
    np.testing.assert_allclose(totals, expected, rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(grad, expected_grad, **close(dtype))
    for counts_dtype in (np.int64, np.float64):
        confusion, loss_sum = np.ones(shape[1] ** 2, counts_dtype), np.ones(1)
        expected_confusion, expected_sum = confusion.copy(), loss_sum.copy()
        loss.score(logits, labels, confusion, loss_sum)
        loss.score_reference(logits, labels, expected_confusion, expected_sum)
        np.testing.assert_array_equal(confusion, expected_confusion)
        np.testing.assert_allclose(loss_sum, expected_sum, rtol=1e-6 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 10), (7, 3), (64, 10)])
def test_weighted_softmax_cross_entropy_equals_the_reference(shape, dtype):
    rng = np.random.default_rng(shape[0])
    logits = operand(rng, shape, dtype, False) * 4
    labels = rng.integers(0, shape[1], size=shape[0]).astype(np.int32)
    weights = rng.uniform(0.1, 3, size=shape[1])
    grad, totals, expected_grad, expected = np.empty(shape, dtype), np.empty(2), np.empty(shape, dtype), np.empty(2)
    loss.weighted_softmax_cross_entropy(logits, labels, weights, grad, totals)
    loss.weighted_softmax_cross_entropy_reference(logits, labels, weights, expected_grad, expected)
    np.testing.assert_allclose(totals, expected, rtol=1e-6 if dtype == np.float32 else 1e-12)
    np.testing.assert_allclose(grad, expected_grad, **close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 1), (5, 3), (64, 10)])
@pytest.mark.parametrize("kernel", ["sigmoid", "mse", "l1", "huber"])
def test_elementwise_losses_equal_the_reference(kernel, shape, dtype):
    rng = np.random.default_rng(sum(shape))
    logits = operand(rng, shape, dtype, False) * 4
    logits[0, 0] = 30  # sigmoid(-30) is far below the float64 epsilon of 1 - sigmoid(30)
    if kernel == "sigmoid":
        targets = rng.integers(0, 2, size=shape).astype(dtype)
        run, arguments = elementwise_loss.sigmoid_cross_entropy, (2.5,)
    else:
        targets = operand(rng, shape, dtype, True)
        targets[-1, -1] = logits[-1, -1]  # the subgradient at 0
        run, arguments = elementwise_loss.regression, ({"mse": 0, "l1": 1, "huber": 2}[kernel], 0.7)
    grad, totals, expected_grad, expected = np.empty(shape, dtype), np.empty(2), np.empty(shape, dtype), np.empty(2)
    run(logits, targets, *arguments, grad, totals)
    getattr(elementwise_loss, run.__name__ + "_reference")(logits, targets, *arguments, expected_grad, expected)
    np.testing.assert_allclose(totals, expected, rtol=1e-12)
    np.testing.assert_allclose(grad, expected_grad, **close(dtype))


@pytest.mark.parametrize("kind", ["none", "relu", "tanh"])  # the layer's fused activation
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 5, 1), (2, 3, 1), (32, 7, 1), (1, 3, 9), (5, 4, 49)])
def test_batchnorm_kernels_equal_the_reference(shape, dtype, training, kind):
    rng = np.random.default_rng(shape[2])
    x = (rng.normal(size=shape) * 3 + 1).astype(dtype)
    dy = rng.normal(size=shape).astype(dtype)
    gamma, beta = rng.normal(size=shape[1]).astype(dtype), rng.normal(size=shape[1]).astype(dtype)
    results = []
    for forward, backward in ((batchnorm.forward, batchnorm.backward),
                              (batchnorm.forward_reference, batchnorm.backward_reference)):
        mean, var = np.full(shape[1], 0.5, dtype), np.full(shape[1], 2.0, dtype)
        x_hat, y, inv_std = np.empty(shape, dtype), np.empty(shape, dtype), np.empty(shape[1], dtype)
        forward(x, gamma, beta, 1e-5, mean, var, 0.9, training, x_hat, inv_std, y, kind)
        dgamma, dbeta, dx, dz = np.empty(shape[1], dtype), np.empty(shape[1], dtype), *np.empty((2, *shape), dtype)
        backward(dy, y, kind, dz, x_hat, inv_std, gamma, dgamma, dbeta, dx)
        results.append((mean, var, x_hat, y, inv_std, dgamma, dbeta, dx))
    tolerance = {"rtol": 2e-4, "atol": 2e-5} if dtype == np.float32 else {"rtol": 1e-9, "atol": 1e-11}
    for got, expected in zip(*results):
        np.testing.assert_allclose(got, expected, **tolerance)
    if kind == "relu":
        assert (results[0][3] >= 0).all() and (results[0][3] == 0).any()


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_the_batch_gather_equals_indexing_then_scaling(batch, dtype):
    rng = np.random.default_rng(batch)
    stored_x = (rng.random((100, 1, 5, 3)) * 255).astype(dtype)
    stored_y = rng.integers(0, 10, 100).astype(np.int32)
    index = np.sort(rng.permutation(100)[:batch]).astype(np.int64)
    x, y = np.empty((batch, 1, 5, 3), np.float32), np.empty(batch, np.int32)
    rows.gather_scaled(stored_x, stored_y, index, 1 / 255 / 0.3, -0.2 / 0.3, x, y)
    expected_x = stored_x[index].astype(np.float32)  # the numpy steps the kernel computes as
    expected_x *= np.float32(1 / 255 / 0.3)
    expected_x += np.float32(-0.2 / 0.3)
    np.testing.assert_array_equal(x, expected_x)
    np.testing.assert_array_equal(y, stored_y[index])


def test_the_workspace_hands_out_one_array_per_name_shape_and_dtype():
    part = Workspace(np).part("03_dense")
    a = part("y", (4, 5), np.float32)
    assert part("y", (4, 5), np.float32) is a
    assert part("y", (2, 5), np.float32) is not a and part("y", (4, 5), np.float64) is not a
    grown = part.at_least("message", 10, np.int32)
    assert grown.size == 10 and part.at_least("message", 7, np.int32).base is grown.base
    assert part.at_least("message", 11, np.int32).size == 11  # grown, to at least twice
    assert part.workspace.nbytes == 4 * 5 * 4 + 2 * 5 * 4 + 4 * 5 * 8 + 20 * 4
    assert [row[:2] for row in part.workspace.table()][:1] == [("03_dense", "y")]


def test_the_allocation_trace_sees_an_array_made_and_freed_inside_a_span():
    trace = AllocationTrace(enabled=True)
    for _ in range(3):
        with trace.span("step"):
            np.ones(10_000).sum()
    with trace.span("evaluation"):  # warm-up only: not counted
        np.ones(10_000)
    assert trace.worst()["step"] >= 80_000 and "evaluation" not in trace.worst()
