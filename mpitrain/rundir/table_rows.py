"""A checkpoint's sharded embedding tables (`shard: rows`): each rank writes its rows to a file of its own beside the
checkpoint, and any number of ranks reads them back, each only the rows it now holds.

    checkpoints/ckpt-EEEE-SSSSSS.h5          the checkpoint; its `sharded_tables` say each table's name, rows, dim
                                             and arrays, and its `ranks` how many rows files there are
    checkpoints/ckpt-EEEE-SSSSSS.rows-R.h5   rank R's rows of each table: NAME/params and NAME/SLOT (each updater
                                             state slot), (rows of rank R, dim), ids R, R + ranks, ... in order

The rows files are written first, each atomically by its rank, and the checkpoint last (rank 0), so a checkpoint
that exists has its rows; one whose rows file is missing or damaged is damaged as a whole (`check_rows`). A rank of
a run of R' ranks holds ids r, r + R', ...; those that rank q of the R writers held form one strided slice of q's
file (step lcm(R, R') / R), so each rank reads its share with at most R strided reads and never the whole table.
"""
from __future__ import annotations

import glob
import math
import os

import h5py
import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.base.files import write_hdf5
from mpitrain.parallel.sharded_rows import RowSharding


def rows_path(checkpoint: str, rank: int) -> str:
    """The rows file of rank `rank` beside the checkpoint at `checkpoint`."""
    return f"{checkpoint.removesuffix('.h5')}.rows-{rank}.h5"


def describe(tables) -> list[dict]:
    """What a checkpoint records of `tables` (`ShardedTable`s): each one's name, rows, dim and array names."""
    return [{"name": table.name, "rows": table.rows, "dim": table.dim, "arrays": sorted(table.arrays())}
            for table in tables]


def write_rows(checkpoint: str, rank: int, tables) -> None:
    """Write this rank's rows of `tables` beside `checkpoint` (atomically: complete or absent). Not a collective."""
    def fill(f):
        for table in tables:
            for name, array in table.arrays().items():
                f.create_dataset(f"{table.name}/{name}", data=array, fletcher32=array.size > 0)
    write_hdf5(rows_path(checkpoint, rank), fill)


def remove_rows(checkpoint: str) -> None:
    """Delete the rows files of `checkpoint` (with it, when `checkpoint.keep` drops it)."""
    for path in glob.glob(glob.escape(checkpoint.removesuffix(".h5")) + ".rows-*.h5"):
        os.remove(path)


def check_rows(checkpoint: str, described: list[dict], ranks: int) -> None:
    """A DataError naming the first of the `ranks` rows files of `checkpoint` that is missing or lacks an array of
    the `described` tables (rank 0, when it chooses the checkpoint to resume)."""
    for rank in range(ranks):
        path = rows_path(checkpoint, rank)
        try:
            with h5py.File(path, "r") as f:
                for table in described:
                    for name in table["arrays"]:
                        if f"{table['name']}/{name}" not in f:
                            raise KeyError(f"no {table['name']}/{name}")
        except (OSError, KeyError) as e:
            raise DataError(f"{checkpoint}: its sharded table rows of rank {rank} ({path}) cannot be read ({e})") \
                from None


def read_share(checkpoint: str, written_by: int, table: dict, array: str, sharding: RowSharding, rank: int,
               out: np.ndarray) -> None:
    """Fill `out` ((rows rank `rank` holds under `sharding`, dim)) with `array` of `table` (a `describe` entry) at
    those rows, from the rows files of the `written_by` ranks that wrote `checkpoint`. Not a collective."""
    ranks = sharding.ranks
    period = math.lcm(ranks, written_by)  # ids rank `rank` holds that rank q held recur every `period` ids
    for q in range(written_by):
        first = next((i for i in range(rank, min(rank + period, table["rows"]), ranks) if i % written_by == q), None)
        if first is None:
            continue
        try:
            with h5py.File(rows_path(checkpoint, q), "r") as f:
                stored = f[f"{table['name']}/{array}"]
                part = stored[first // written_by::period // written_by]
        except (OSError, KeyError) as e:
            raise DataError(f"{rows_path(checkpoint, q)}: cannot read {table['name']}/{array} ({e})") from None
        out[(first - rank) // ranks::period // ranks][:len(part)] = part
