"""`sharing`'s two exchanges of threshold messages, and how `sync.exchange: auto` picks one each step.

| exchange    | after the Allgather of the message sizes            | bytes per rank (P ranks, k-byte messages) |
| ----------- | --------------------------------------------------- | ----------------------------------------- |
| `allgather` | an Allgatherv of the messages; every rank adds them | (P-1) k: grows with P                     |
| `split`     | an Alltoallv of the messages' index blocks (rank j  | about k + the reduced blocks, never more  |
|             | gets block j of each and sums it), an Allgatherv of | than a dense ring Allreduce (8n (P-1)/P)  |
|             | the reduced blocks, each sparse or dense            | plus headers (SparCML's split allgather)  |

Either way every replica gets the mean of the ranks' sent updates and the replicas stay
bit-identical; the two differ from each other only in the order the same terms are summed.
An exchange is a callable `(comm, message, sizes, params, received) -> elements sent by all
ranks`, where `sizes` is every rank's message size (the Allgather the step has done),
`params` the flat parameters it adds to and `received` a reusable int32 buffer of at least
the sizes' sum. `choose_exchange` gives every rank the same choice, as it
reads only the allgathered sizes, the model's size and the config.
"""
from __future__ import annotations

from mpitrain.parallel.backend import array_module
from mpitrain.parallel.costmodel import allgather_exchange, allreduce_bytes, split_exchange, split_header_bytes
from mpitrain.kernels.threshold import message_count, threshold_decode
from mpitrain.kernels.threshold.blocks import add_block, block_bounds, cut_message, encode_block, reduce_parts

INT32_BYTES = 4  # a threshold message is int32


def allgather(comm, message, sizes, params, received=None) -> int:
    """Every rank gets every message (Allgatherv, into `received` when given: int32, at least the sizes' sum) and
    adds each, in rank order, divided by the ranks. A collective."""
    messages = comm.allgatherv(message, sizes, received)
    for each in messages:  # rank order on every rank: identical sums, identical replicas
        threshold_decode(each, params, 1.0 / comm.size)
    return sum(message_count(each) for each in messages)


def split(comm, message, sizes, params, received=None) -> int:
    """Rank j sums block j of every message in rank order (an Alltoallv of the blocks: a sparse reduce-scatter);
    every rank adds every reduced block (an Allgatherv), so each block's sum is made once and copied. A collective.
    (`sizes` is not needed: the Alltoallv exchanges the sizes of the parts.) Its parts and blocks are new arrays
    each step (`received` is not used): the one exchange whose step still allocates."""
    bounds = block_bounds(params.size, comm.size)
    parts, part_sizes = cut_message(message, bounds)
    own = array_module(params).zeros(int(bounds[comm.rank + 1] - bounds[comm.rank]), dtype=params.dtype)
    sent = reduce_parts(comm.alltoallv(parts, part_sizes), own, 1.0 / comm.size)
    reduced = comm.allgatherv(encode_block(own, sent))
    return sum(add_block(block, params[lo:hi]) for block, lo, hi in zip(reduced, bounds[:-1], bounds[1:]))


EXCHANGES = {"allgather": allgather, "split": split}


def choose_exchange(setting: str, network, sizes, n: int, itemsize: int) -> str:
    """`setting` itself, or for `auto`: `split` when the allgather would put more bytes on a rank's wire than a dense
    ring Allreduce of the `n` parameters of `itemsize` bytes (plus the messages' headers), else the exchange
    `network`'s cost model predicts faster for messages of `sizes` int32 (one per rank); a tie goes to
    `allgather`. Not a collective.

    The bytes come first: where the allgather outgrows a dense Allreduce the model may still call it faster on
    an idle network (its steps are fewer), but on a shared one every byte competes, and `sharing` is chosen to
    send fewer bytes than `allreduce`, never more."""
    if setting != "auto":
        return setting
    nbytes = [INT32_BYTES * int(size) for size in sizes]
    gathered = allgather_exchange(network, nbytes)
    if gathered[1] > allreduce_bytes(n * itemsize, len(sizes)) + split_header_bytes(len(sizes)):
        return "split"
    return "split" if split_exchange(network, nbytes, n, itemsize)[0] < gathered[0] else "allgather"
