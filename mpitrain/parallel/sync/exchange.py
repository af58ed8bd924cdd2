"""`sharing`'s three exchanges of threshold messages, and how `sync.exchange: auto` picks one each step.

| exchange    | after the Allgather of the message sizes             | messages and bytes per rank (P ranks,      |
|             |                                                      | k-byte messages, n parameters)             |
| ----------- | ---------------------------------------------------- | ------------------------------------------ |
| `allgather` | an Allgatherv of the messages; every rank adds them  | log2 P or P-1; (P-1) k: grows with P       |
| `split`     | an Alltoallv of the messages' index blocks (rank j   | about 2P; about k + the reduced blocks,    |
|             | gets block j of each and sums it), an Allgatherv of  | never more than a dense ring Allreduce     |
|             | the reduced blocks, each sparse or dense             | (8n (P-1)/P) plus headers (SparCML)        |
| `recursive` | the messages as integer counts, summed by recursive  | 2 log2 P (+2 where P is not a power of     |
|             | halving (a sparse reduce-scatter) and gathered by    | two); at most 2 w n (P-1)/P for counts of  |
|             | recursive doubling, each block sparse or dense       | w bytes (1 to 127 ranks, 2 to 32767)       |

Every replica gets the mean of the ranks' sent updates and the replicas stay bit-identical;
the exchanges differ from each other only in the order the same terms are summed.
An exchange is a callable `(comm, codec, message, sizes, params, received) -> elements sent by
all ranks`, where `codec` made the messages (`mpitrain.parallel.sync.codec`; `allgather` decodes
through it, `split` and `recursive` read the threshold message's blocks and counts themselves),
`sizes` is every rank's message size (the Allgather the step has done), `params` the flat
parameters it adds to and `received` a reusable int32 buffer of at least the sizes' sum. `choose_exchange` gives every rank the same choice, as it
reads only the allgathered sizes, the model's size and the config.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.kernels.threshold import implementation
from mpitrain.kernels.threshold.blocks import add_block, block_bounds, cut_message, encode_block, reduce_parts
from mpitrain.kernels.threshold.counts import (
    add_counts,
    add_message,
    add_scaled,
    count_dtype,
    counts_capacity,
    encode_counts,
)
from mpitrain.kernels.threshold.message import read_header
from mpitrain.parallel.costmodel import (
    allgather_exchange,
    allreduce_bytes,
    recursive_exchange,
    split_exchange,
    split_header_bytes,
)

INT32_BYTES = 4  # a threshold message is int32


def allgather(comm, codec, message, sizes, params, received=None) -> int:
    """Every rank gets every message (Allgatherv, into `received` when given: int32, at least the sizes' sum) and
    adds each, in rank order, divided by the ranks, through the codec. A collective."""
    messages = comm.allgatherv(message, sizes, received)
    # rank order on every rank: identical sums, identical replicas
    return sum(codec.decode(each, params, 1.0 / comm.size) for each in messages)


def split(comm, codec, message, sizes, params, received=None) -> int:
    """Rank j sums block j of every message in rank order (an Alltoallv of the blocks: a sparse reduce-scatter);
    every rank adds every reduced block (an Allgatherv), so each block's sum is made once and copied. A collective.
    (`sizes` is not needed: the Alltoallv exchanges the sizes of the parts.) Its parts and blocks are new arrays
    each step (`received` is not used): the one exchange whose step still allocates. The messages are the
    threshold codec's (`codec` is not used)."""
    bounds = block_bounds(params.size, comm.size)
    parts, part_sizes = cut_message(message, bounds)
    own = array_module(params).zeros(int(bounds[comm.rank + 1] - bounds[comm.rank]), dtype=params.dtype)
    sent = reduce_parts(comm.alltoallv(parts, part_sizes), own, 1.0 / comm.size)
    reduced = comm.allgatherv(encode_block(own, sent))
    return sum(add_block(block, params[lo:hi]) for block, lo, hi in zip(reduced, bounds[:-1], bounds[1:]))


def recursive(comm, codec, message, sizes, params, received=None) -> int:
    """The messages as integer counts (every rank sends the same tau), summed by recursive halving and gathered by
    recursive doubling over the largest power of two of ranks, P'; each rank beyond it first hands its counts to
    a partner inside and gets the sum back at the end. 2 log2 P' pairwise exchanges (+2), each a count block of
    half or a growing part of the parameters, sparse or dense (SparCML's recursive doubling, after a sparse
    reduce-scatter). Counts add exactly, so every rank holds the same sums whatever the pairs' order, and adds
    count x tau / P to `params`. A collective made of pairwise exchanges. Its counts and blocks are new arrays
    each step (`sizes` and `received` are not used). The messages are the threshold codec's (`codec` is not
    used)."""
    n, rank, ranks = params.size, comm.rank, comm.size
    xp = array_module(params)
    counts = xp.zeros(n, dtype=count_dtype(ranks))
    tau = read_header(implementation(message), message)[2]
    sent = add_message(message, counts)
    inbox = xp.empty(counts_capacity(n, counts.dtype), dtype=np.int32)
    core = 1 << (ranks.bit_length() - 1)  # the largest power of two of ranks
    extra = ranks - core  # ranks 0, 2, .., 2 (extra-1) fold into the odd rank after them
    if rank < 2 * extra and rank % 2 == 0:
        comm.sendrecv(encode_counts(counts, sent, tau), rank + 1, None, None)
        counts[...] = 0
        sent = add_counts(comm.sendrecv(None, None, inbox, rank + 1), counts, tau)
    else:
        if rank < 2 * extra:
            sent += add_counts(comm.sendrecv(None, None, inbox, rank - 1), counts, tau)
        sent = _halve_and_double(comm, counts, sent, tau, rank // 2 if rank < 2 * extra else rank - extra,
                                 core, extra, inbox)
        if rank < 2 * extra:
            comm.sendrecv(encode_counts(counts, sent, tau), rank - 1, None, None)
    add_scaled(counts, params, 1.0 / ranks * float(tau))  # the step a decode adds, x the count
    return sent


def _halve_and_double(comm, counts, sent, tau, me: int, core: int, extra: int, inbox) -> int:
    """Core rank `me` of `core` (a power of two): counts summed over all core ranks, by index blocks. Returns the
    elements all ranks sent."""
    bounds = block_bounds(counts.size, core)

    def rank_of(other: int) -> int:
        return 2 * other + 1 if other < extra else other + extra

    def blocks(lo: int, hi: int):
        return counts[int(bounds[lo]):int(bounds[hi])]

    lo, hi, distance = 0, core, core // 2
    while distance:  # recursive halving: send the half the partner keeps, add in the half it sends
        partner, mid = rank_of(me ^ distance), (lo + hi) // 2
        give, keep = ((lo, mid), (mid, hi)) if me & distance else ((mid, hi), (lo, mid))
        block = comm.sendrecv(encode_counts(blocks(*give), sent, tau), partner, inbox, partner)
        sent += add_counts(block, blocks(*keep), tau)  # the partner's ranks' elements join this rank's
        (lo, hi), distance = keep, distance // 2
    distance = 1
    while distance < core:  # recursive doubling: this rank's summed blocks for the partner's, as many
        partner, other = rank_of(me ^ distance), lo ^ distance
        block = comm.sendrecv(encode_counts(blocks(lo, hi), sent, tau), partner, inbox, partner)
        theirs = blocks(other, other + distance)
        theirs[...] = 0  # it held this rank's partial sums, sent away while halving
        add_counts(block, theirs, tau)
        lo, hi, distance = min(lo, other), max(hi, other + distance), 2 * distance
    return sent


EXCHANGES = {"allgather": allgather, "split": split, "recursive": recursive}


def choose_exchange(setting: str, network, sizes, n: int, itemsize: int, carried=tuple(EXCHANGES)) -> str:
    """`setting` itself, or for `auto`: of the exchanges that carry the codec's messages (`carried`) and put no more
    bytes on a rank's wire than a dense ring Allreduce of the `n` parameters of `itemsize` bytes (plus the split
    exchange's headers), the one `network`'s cost model predicts fastest for messages of `sizes` int32 (one per
    rank); ties go to `allgather`, then `recursive`. `split` stays within that bound by construction; `allgather`
    is the fallback where it is the only one carried. Not a collective.

    The bytes come first: where the allgather outgrows a dense Allreduce the model may still call it faster on
    an idle network (its steps are fewer), but on a shared one every byte competes, and `sharing` is chosen to
    send fewer bytes than `allreduce`, never more."""
    if setting != "auto":
        return setting
    nbytes = [INT32_BYTES * int(size) for size in sizes]
    costs = {"allgather": allgather_exchange(network, nbytes), "recursive": recursive_exchange(network, nbytes, n),
             "split": split_exchange(network, nbytes, n, itemsize)}
    bound = allreduce_bytes(n * itemsize, len(sizes)) + split_header_bytes(len(sizes))
    within = [name for name, (_, wire) in costs.items() if name in carried and (name == "split" or wire <= bound)]
    return min(within or ["allgather"], key=lambda name: costs[name][0])
