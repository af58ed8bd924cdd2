"""mpitrain.parallel.sync.powersgd at one rank: the error feedback leaves no gradient mass behind (over any steps
the gradients applied plus the error left equal the true gradients' sum, to float32 rounding); a gradient of rank r
is reproduced exactly once the warm start has found it; vectors and matrices no larger than their factors go
whole; the factors' bytes."""
import numpy as np

from mpitrain.parallel.sync.powersgd import PowerSGD, allreduce_bytes

LAYOUT = [("00_dense/W", (20, 12)), ("00_dense/b", (12,)), ("01_dense/W", (12, 2)), ("01_dense/b", (2,)),
          ("02_conv/W", (3, 3, 4, 8))]


class OneRank:
    """A communicator of one rank: its sums are its own values."""

    size = 1

    def average_(self, buf):
        pass

    def iallreduce_(self, buf):
        return "posted"

    def complete(self, posted):
        assert posted == ["posted"]


def test_no_gradient_mass_is_left_behind_over_steps():
    power = PowerSGD(LAYOUT, rank=1, xp=np)
    size = sum(int(np.prod(shape)) for _, shape in LAYOUT)
    rng = np.random.default_rng(0)
    true_sum, applied_sum = np.zeros(size), np.zeros(size)
    for _ in range(7):
        grads = rng.normal(size=size).astype(np.float32)
        true_sum += grads
        power.mean_(OneRank(), grads)
        applied_sum += grads
    left = np.zeros(size)
    for (start, stop, _), error in zip(power.matrices, power.errors):
        left[start:stop] = error.ravel()
    np.testing.assert_allclose(applied_sum + left, true_sum, atol=1e-4)
    assert np.abs(left).max() > 0.1  # rank 1 does leave errors, to be sent later


def test_a_gradient_of_its_rank_is_sent_exactly_and_small_parts_go_whole():
    power = PowerSGD(LAYOUT, rank=2, xp=np)
    assert [m[:2] for m in power.matrices] == [(0, 240), (278, 566)]  # 20x12, the conv's 36x8; 12x2 goes whole
    assert power.vectors == [(240, 252), (252, 276), (276, 278)]
    rng = np.random.default_rng(1)
    grads = np.zeros(566, np.float32)
    low_rank = (rng.normal(size=(20, 2)) @ rng.normal(size=(2, 12))).astype(np.float32)
    for _ in range(3):  # the warm start converges on the gradient's two directions
        grads[:240] = low_rank.ravel()
        grads[240:278] = rng.normal(size=38)
        whole = grads[240:278].copy()
        power.mean_(OneRank(), grads)
    np.testing.assert_allclose(grads[:240].reshape(20, 12), low_rank, atol=1e-4)
    np.testing.assert_array_equal(grads[240:278], whole)
    assert sum(allreduce_bytes(LAYOUT, 2)) == 4 * (2 * (20 + 12) + 2 * (36 + 8) + 38)
