"""`sharing`'s codec slot: how a rank's residual becomes its message, and a message goes back into the parameters.

    codec = CODECS[options.codec](options.encoding)
    message = codec.encode(residual, tau, out)       # the residual keeps what was not sent; None: it holds NaN
    sent = codec.decode(message, params, 1 / ranks)  # params += the message's values x the scale

Horovod's `Compressor` shape (compress, decompress), with the error feedback (the residual) and the threshold
`tau` kept by the mode (`mpitrain.parallel.sync.sharing`), which adapts tau to the sparsity whatever the codec;
a codec keeps no state of its own, so a checkpoint of the mode is a checkpoint of its codec. A codec declares
`exchanges`, those of `mpitrain.parallel.sync.exchange` that can carry its messages: `allgather` decodes every
message through the codec, whereas `split` and `recursive` cut and sum the threshold message's own index blocks
and counts, so a second codec (top-k, say) starts with `allgather`. A new codec is a class here (or beside) with
these methods, plus its line in `CODECS`; `sync.codec` picks it, and the mode does not change.
"""
from __future__ import annotations

from mpitrain.kernels.threshold import NaNResidual, message_capacity, message_count, threshold_decode, threshold_encode
from mpitrain.kernels.threshold import warm_up as warm_up_kernels


class ThresholdCodec:
    """DL4J's threshold encoding (Strom 2015): every element with |r_i| >= tau leaves the residual as a signed
    +-tau, sent as sparse int32 indices, or a bitmap once denser than 1/16 (`encoding`: auto, sparse or bitmap);
    see `mpitrain.kernels.threshold`. Not a collective, any of it."""

    exchanges = ("allgather", "split", "recursive")

    def __init__(self, encoding: str = "auto"):
        self.encoding = encoding

    def capacity(self, n: int) -> int:
        """The int32 length of the longest message of `n` parameters: the buffer `encode` writes into."""
        return message_capacity(n, self.encoding)

    def encode(self, residual, tau: float, out):
        """This rank's message of `residual` at threshold `tau`, written into the front of `out` (int32, at least
        `capacity(residual.size)` long), the sent part taken out of the residual; None when the residual holds NaN
        (the mode stops every rank then)."""
        try:
            return threshold_encode(residual, tau, self.encoding, out)
        except NaNResidual:
            return None

    def decode(self, message, params, scale: float) -> int:
        """params += scale x the values `message` sends; the elements it sent."""
        threshold_decode(message, params, scale)
        return message_count(message)

    def warm_up(self, like) -> None:
        """Run the kernels once on a few elements of `like`'s dtype and device (numba's first call, a CUDA
        kernel's first launch), so the first step is not charged for them."""
        warm_up_kernels(like)


CODECS = {"threshold": ThresholdCodec}
