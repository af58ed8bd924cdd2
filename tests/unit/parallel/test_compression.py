"""mpitrain.parallel.sync.compression's codecs against their references: bf16 as PyTorch rounds float32 to bfloat16
(to nearest, ties to even), fp16 as float16 of the values times a power of two that takes the largest to 2**15;
a message of zeros, of one rank's empty chunk, and of a NaN; the mean at one rank; the config's domain."""
import numpy as np
import pytest
import torch

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import SyncConfig
from mpitrain.parallel.sync.compression import Bf16, Fp16, chunk_bounds, compressed_mean_


def values(n=4096, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=n) * 10.0 ** rng.integers(-8, 8, n)).astype(np.float32)


def decoded(codec, v):
    out = np.empty(v.size, np.float32)
    codec.decode(codec.encode(v), out)
    return out


def test_bf16_rounds_as_pytorch_does_and_keeps_float32s_range():
    v = np.concatenate([values(), np.float32([3e38, -1e-38, 0.0, 1 + 2**-8, 1 + 3 * 2**-8])])  # two ties
    wire = Bf16().encode(v)
    assert wire.dtype == np.uint16 and wire.size == v.size
    expected = torch.from_numpy(v).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(decoded(Bf16(), v), expected)
    assert (np.abs(decoded(Bf16(), v) - v) <= np.abs(v) * 2.0 ** -8).all()  # half a unit of 8 bits


def test_fp16_scales_by_a_power_of_two_against_overflow_and_underflow():
    for scale_of_values in (1e-7, 1.0, 1e9):
        v = (values(seed=1)[:1000] / np.abs(values(seed=1)[:1000]).max() * scale_of_values).astype(np.float32)
        wire = Fp16().encode(v)
        assert wire.size == v.size + 2
        scale = wire[:2].view(np.float32)[0]
        assert np.log2(scale) == np.round(np.log2(scale)) and 2**14 < np.abs(v).max() * scale <= 2**15
        expected = (v.astype(np.float64) * scale).astype(np.float16).astype(np.float64) / scale
        np.testing.assert_array_equal(decoded(Fp16(), v), expected.astype(np.float32))
        big = np.abs(v) > np.abs(v).max() * 2.0 ** -14  # float16's normal range below the largest
        assert (np.abs(decoded(Fp16(), v) - v)[big] <= np.abs(v)[big] * 2.0 ** -11).all()


@pytest.mark.parametrize("codec", [Bf16(), Fp16()], ids=["bf16", "fp16"])
def test_zeros_nothing_and_nan_go_through(codec):
    np.testing.assert_array_equal(decoded(codec, np.zeros(5, np.float32)), np.zeros(5))
    assert decoded(codec, np.zeros(0, np.float32)).size == 0
    assert np.isnan(decoded(codec, np.float32([1.0, np.nan]))[1])  # a NaN gradient stays one, for the loss check


def test_one_rank_gets_its_own_values_through_the_codec_and_chunks_cover_the_buffer():
    class One:
        size, rank = 1, 0

        def ialltoallv_(self, parts, counts, out):
            out[...] = parts[:counts[0]]
            return "posted"

        def complete(self, posted):
            assert posted == ["posted"]

        def allgatherv(self, message, counts):
            return [message]
    v = values(100)
    buf = v.copy()
    compressed_mean_(One(), buf, Bf16())
    np.testing.assert_array_equal(buf, decoded(Bf16(), v))
    assert chunk_bounds(10, 4).tolist() == [0, 2, 5, 7, 10] and chunk_bounds(2, 4).tolist() == [0, 0, 1, 1, 2]


def test_compression_is_checked_against_its_domain():
    assert SyncConfig(compression="bf16").validate("run.yaml").compression == "bf16"
    with pytest.raises(ConfigError, match=r"sync.compression is 'zip', expected one of .*'none', 'bf16', "
                                          r"'fp16', 'powersgd'"):
        SyncConfig(compression="zip").validate("run.yaml")
