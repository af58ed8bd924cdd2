"""A checkpoint's sharded embedding tables (`shard: rows`): each rank writes its rows beside the checkpoint, and any
number of ranks reads them back, each only the rows it now holds.

    checkpoints/ckpt-EEEE-SSSSSS.h5                                  the checkpoint; its `sharded_tables` say each
                                                                     table's name, rows, dim and arrays, its `ranks`
                                                                     how many ranks wrote rows
    checkpoints/ckpt-EEEE-SSSSSS.rows/R/LAYER/TABLE/ARRAY.npy        rank R's rows of a table: `params` and each
                                                                     updater state slot, (rows of rank R, dim), ids
                                                                     R, R + ranks, ... in order

Each array is a plain .npy file, streamed from the rank's memory (`mpitrain.base.files.write_file`: a temporary
file, fsync, a rename), so a rank never holds a second copy of its rows to write them, and a full disk fails as one
line. The rows are written first and the checkpoint last (rank 0), so a checkpoint that exists has its rows; one
whose rows are missing or unreadable is damaged as a whole (`check_rows`). A rank of a run of R' ranks holds ids
r, r + R', ...; those that rank q of the R writers held form one strided slice of q's file (step lcm(R, R') / R),
read through a memory map: each rank reads its share, never the whole table. The rows carry no checksum (the
checkpoint's own arrays do): a flipped bit inside them is not found.
"""
from __future__ import annotations

import math
import os
import shutil

import numpy as np

from mpitrain.base.errors import DataError
from mpitrain.base.files import write_file
from mpitrain.parallel.sharded_rows import RowSharding


def rows_folder(checkpoint: str) -> str:
    """The folder of the rows of the checkpoint at `checkpoint`."""
    return checkpoint.removesuffix(".h5") + ".rows"


def rows_file(checkpoint: str, rank: int, table: str, array: str) -> str:
    """Rank `rank`'s `array` of `table` (LAYER/TABLE) beside `checkpoint`."""
    return os.path.join(rows_folder(checkpoint), str(rank), *table.split("/"), f"{array}.npy")


def describe(tables) -> list[dict]:
    """What a checkpoint records of `tables` (`ShardedTable`s): each one's name, rows, dim and array names."""
    return [{"name": table.name, "rows": table.rows, "dim": table.dim, "arrays": sorted(table.arrays())}
            for table in tables]


def write_rows(checkpoint: str, rank: int, tables) -> None:
    """Write this rank's rows of `tables` beside `checkpoint`, each array complete or absent. Not a collective."""
    for table in tables:
        for name, array in table.arrays().items():
            array = np.ascontiguousarray(array)
            write_file(rows_file(checkpoint, rank, table.name, name),
                       lambda f, array=array: np.lib.format.write_array(f, array, allow_pickle=False),
                       binary=True, size=array.nbytes)


def remove_rows(checkpoint: str) -> None:
    """Delete the rows of `checkpoint` (with it, when `checkpoint.keep` drops it, or before a new best one)."""
    shutil.rmtree(rows_folder(checkpoint), ignore_errors=True)


def check_rows(checkpoint: str, described: list[dict], ranks: int) -> None:
    """A DataError naming the first rows file of the `ranks` ranks that wrote `checkpoint` that is missing or not
    the rows of `described` it should hold (rank 0, when it chooses the checkpoint to resume)."""
    for table in described:
        sharding = RowSharding(table["rows"], ranks)
        for rank in range(ranks):
            for name in table["arrays"]:
                path = rows_file(checkpoint, rank, table["name"], name)
                shape = _stored(checkpoint, path).shape
                if shape != (sharding.shard_rows(rank), table["dim"]):
                    raise DataError(f"{checkpoint}: {path} holds an array of shape {list(shape)}, expected "
                                    f"{[sharding.shard_rows(rank), table['dim']]} (rank {rank}'s rows of "
                                    f"{table['name']})")


def read_share(checkpoint: str, written_by: int, table: dict, array: str, sharding: RowSharding, rank: int,
               out: np.ndarray) -> None:
    """Fill `out` ((rows rank `rank` holds under `sharding`, dim)) with `array` of `table` (a `describe` entry) at
    those rows, from the rows of the `written_by` ranks that wrote `checkpoint`. Not a collective."""
    ranks = sharding.ranks
    period = math.lcm(ranks, written_by)  # ids rank `rank` holds that rank q held recur every `period` ids
    for q in range(written_by):
        first = next((i for i in range(rank, min(rank + period, table["rows"]), ranks) if i % written_by == q), None)
        if first is not None:
            stored = _stored(checkpoint, rows_file(checkpoint, q, table["name"], array))
            out[(first - rank) // ranks::period // ranks] = stored[first // written_by::period // written_by]


def _stored(checkpoint: str, path: str) -> np.ndarray:
    """The array of the .npy file `path`, memory-mapped (read where it is sliced); a DataError naming `checkpoint`."""
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise DataError(f"{checkpoint}: its sharded table rows {path} cannot be read ({e})") from None
