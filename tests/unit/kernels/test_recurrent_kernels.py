"""The recurrent layers' backward step kernels (kernels/recurrent.py) equal their ufunc references (cupy's path), on
gates a forward step computed, float32 and float64, batch 1 and odd sizes."""
import numpy as np
import pytest

from mpitrain.kernels import recurrent as kernels

SIZES = [(1, 1), (3, 5), (17, 33)]  # (B, H)
DTYPES = [np.float32, np.float64]


def close(dtype):
    return {"rtol": 1e-5 if dtype == np.float32 else 1e-12, "atol": 1e-6 if dtype == np.float32 else 1e-14}


def arrays(rng, dtype, *shapes):
    return [rng.normal(size=shape).astype(dtype) for shape in shapes]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, units", SIZES)
def test_lstm_step_backward_equals_the_reference(batch, units, dtype):
    rng = np.random.default_rng(batch * units)
    g, recurrent = arrays(rng, dtype, (batch, 4 * units), (batch, 4 * units))
    c_before, c_after, h_after, tanh_c, dh, dc = arrays(rng, dtype, *[(batch, units)] * 6)
    kernels.lstm_step(g, recurrent, c_before, c_after, h_after, tanh_c)  # gates as backward finds them
    got, expected = [(np.empty_like(g), np.empty_like(dc)) for _ in range(2)]
    kernels.lstm_step_backward(g, c_before, tanh_c, dh, dc, *got)
    kernels.lstm_step_backward_reference(g, c_before, tanh_c, dh, dc, *expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, **close(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, units", SIZES)
def test_gru_step_backward_equals_the_reference(batch, units, dtype):
    rng = np.random.default_rng(batch * units)
    g, recurrent = arrays(rng, dtype, (batch, 3 * units), (batch, 3 * units))
    h_before, h_after, recurrent_h, dh = arrays(rng, dtype, *[(batch, units)] * 4)
    kernels.gru_step(g, recurrent, h_before, h_after, recurrent_h)
    got, expected = [(np.empty_like(g), np.empty_like(g), np.empty_like(dh)) for _ in range(2)]
    kernels.gru_step_backward(g, h_before, recurrent_h, dh, *got)
    kernels.gru_step_backward_reference(g, h_before, recurrent_h, dh, *expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, **close(dtype))
