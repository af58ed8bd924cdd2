"""The recurrent layers' step kernels (kernels/recurrent.py) on the CPU: a padded sequence's states are carried over
forward and its gradients pass on unchanged backward, and a step's backward equals the gradient of its forward by
central differences in float64 (float32 too: the same kernels). The GPU's kernels are held to these in
tests/harness/cuda_kernels_check.py."""
import numpy as np
import pytest

from mpitrain.testing.recurrent_steps import SIZES, gradient_check, step_arrays, step_backward, step_forward


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("batch, units", SIZES)
def test_a_padded_sequence_keeps_its_states_and_passes_its_gradients_on(kind, batch, units):
    a = step_arrays(kind, batch, units, np.float64, seed=batch * units)
    step_forward(kind, a)
    padded = a["padded"][a["t"], :, 0]
    for state in ("h", "c") if kind == "lstm" else ("h",):
        np.testing.assert_array_equal(a[state][a["after"]][padded], a[state][a["before"]][padded])
    step_backward(kind, a)
    assert (a["grad_in"][a["t"]][padded] == 0).all() and (a["grad_rec"][a["t"]][padded] == 0).all()
    np.testing.assert_array_equal(a["direct"][padded], a["dh"][padded])
    if kind == "lstm":
        np.testing.assert_array_equal(a["dc_before"][padded], a["dc"][padded])


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_a_steps_backward_is_the_gradient_of_its_forward(kind):
    gradient_check(kind, batch=3, units=4)
