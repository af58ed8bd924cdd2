"""Embedding tables' gradients by the rows a step touched, not the whole table (`allreduce` mode).

A step of a large table touches a few rows (the batch's ids), so each rank sends those rows,
ids and values, instead of the table: after an Allgather of every rank's touched-row count per
table, each table whose rows would put fewer bytes on a rank's wire than a dense Allreduce of
it goes into one Allgatherv of messages `[ids..., values...]` per table (ids as integers of the
gradient's width, their bits carried in its dtype: `id_bits`); the others are
Allreduced whole. Every rank then zeroes the rows any rank touched and adds the ranks' rows in
rank order, so the sums are bit-identical everywhere, and divides them by the ranks: the mean
gradient, as for the dense part. The table then remembers which rows hold values
(`TableGrad.written`: the union, or None after a dense Allreduce), so the next backward clears
just those. The bytes go into the communicator's count as every collective's do.

What PyTorch's DDP does with a sparse `nn.Embedding` gradient (an allgather of indices and
values) and SparCML's sparse allgather, chosen per table and step as `sharing`'s exchanges are.
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.arrays import array_module
from mpitrain.parallel.costmodel import allreduce_bytes


def sparse_is_smaller(counts, row_bytes: int, table_bytes: int) -> bool:
    """Whether the ranks' messages of `counts` rows of `row_bytes` (one count per rank) cost a rank fewer bytes than
    an Allreduce of the table's `table_bytes`: an Allgatherv sends each rank about every other rank's message."""
    message_bytes = np.asarray(counts) * row_bytes
    return float(message_bytes.sum() - message_bytes.min()) < allreduce_bytes(table_bytes, len(message_bytes))


def exchange_tables(comm, model, dense: bool = False) -> None:
    """Sum `model.sparse_tables`' gradients over the ranks and divide by their number, each table by its touched
    rows or whole (see the module docstring; `dense`: every table whole, `sync.embeddings: dense`). A collective:
    every rank has the same tables."""
    tables = model.sparse_tables
    if not tables or comm.size == 1:  # one rank's gradients are already the sum and the mean
        return
    grads, xp = model.grads, array_module(model.grads)
    counts = np.array(comm.allgather_obj([int(table.touched.size) for table in tables]), np.int64)  # (ranks, tables)
    sparse = [not dense and sparse_is_smaller(counts[:, t], (1 + table.dim) * grads.itemsize,
                                              table.rows * table.dim * grads.itemsize)
              for t, table in enumerate(tables)]
    for table, chosen in zip(tables, sparse):
        if not chosen:
            region = grads[table.start:table.stop]
            comm.average_(region)
            table.written = None
    chosen = [t for t, is_sparse in enumerate(sparse) if is_sparse]
    if not chosen:
        return
    message = xp.concatenate([part for t in chosen for part in _message(grads, tables[t])])
    sizes = sum(counts[:, t] * (1 + tables[t].dim) for t in chosen)
    received = comm.allgatherv(message, sizes)
    for position, t in enumerate(chosen):
        table = tables[t]
        matrix = grads[table.start:table.stop].reshape(table.rows, table.dim)
        parts = [_part(each, counts[r], chosen, tables, position) for r, each in enumerate(received)]
        union = xp.unique(xp.concatenate([ids for ids, _ in parts]))
        matrix[union] = 0
        for ids, values in parts:  # rank order: the same sums on every rank
            matrix[ids] += values
        matrix[union] /= comm.size
        table.written = union


def id_bits(dtype) -> np.dtype:
    """The integers whose bits a message of float `dtype` carries its ids in: of the same width (int32 in float32,
    any id of a table of up to 2**31 rows, `mpitrain.data.shards.MAX_IDS`), moved as they are, never converted."""
    return np.dtype(f"int{8 * np.dtype(dtype).itemsize}")


def _message(grads, table):
    """A table's part of this rank's message: its touched ids (their bits, `id_bits`), then their rows."""
    matrix = grads[table.start:table.stop].reshape(table.rows, table.dim)
    return table.touched.astype(id_bits(grads.dtype)).view(grads.dtype), matrix[table.touched].ravel()


def _part(message, counts, chosen, tables, position):
    """(ids, rows) of table `chosen[position]` in one rank's message (its touched-row `counts` per table)."""
    offset = sum(int(counts[t]) * (1 + tables[t].dim) for t in chosen[:position])
    t = chosen[position]
    n, dim = int(counts[t]), tables[t].dim
    ids = message[offset:offset + n].view(id_bits(message.dtype)).astype(np.int64)
    return ids, message[offset + n:offset + n * (1 + dim)].reshape(n, dim)


def average_table_rows(comm, model, changed: list) -> None:
    """Average `model.sparse_tables`' parameters over the ranks where any rank changed them: `changed[t]` are the
    rows of table t this rank changed since the tables were last identical (an int64 array), or None when any row
    may differ (the whole table is averaged). For each table, the union of every rank's rows is allgathered and then
    those rows' values, when that costs fewer bytes than an Allreduce of the table; otherwise it is averaged whole.
    Every rank adds the values in rank order: identical replicas. A collective (`averaging` mode)."""
    tables, params = model.sparse_tables, model.params
    if comm.size == 1:
        return
    xp = array_module(params)
    counts = comm.allgather_obj([int(rows.size) if rows is not None else -1 for rows in changed])
    ids = comm.allgatherv(xp.concatenate([rows.astype(np.int64) for rows in changed if rows is not None]
                                         or [xp.zeros(0, np.int64)]),
                          np.array([sum(c for c in each if c >= 0) for each in counts], np.int64))
    for t, table in enumerate(tables):
        matrix = params[table.start:table.stop].reshape(table.rows, table.dim)
        every = [c[t] for c in counts]
        if min(every) >= 0:
            offsets = [sum(c[u] for u in range(t) if c[u] >= 0) for c in counts]
            union = xp.unique(xp.concatenate([ids[r][offsets[r]:offsets[r] + every[r]] for r in range(comm.size)]))
            if sparse_is_smaller([union.size] * comm.size, table.dim * params.itemsize, matrix.nbytes):
                values = comm.allgatherv(matrix[union].ravel())
                matrix[union] = 0
                for each in values:  # rank order: the same sums on every rank
                    matrix[union] += each.reshape(union.size, table.dim)
                matrix[union] /= comm.size
                continue
        comm.average_(matrix.reshape(-1))
