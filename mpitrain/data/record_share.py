"""A rank's share of raw Parquet records, for scoring them under MPI (`mpitrain predict RUN --records PATH`).

    share = RecordShare("new/clicks.parquet", rank, ranks, columns=["age", "user"])
    for first_row, table in share.chunks(65536):     # first_row: the chunk's first record's index in the records
        ...

PATH is a Parquet file or a folder of them (pyarrow's dataset, files in sorted order). Its row groups are shared out
round-robin: row group g (counted over the files in order) goes to rank g mod ranks, so each rank reads only its own
row groups, and only the columns asked for. A record's index is its place in the whole of PATH. Not a collective.
"""
from __future__ import annotations

import os
from itertools import accumulate

from mpitrain.base.errors import DataError


class RecordShare:
    """This rank's row groups of the Parquet records at `path`, read by `columns`."""

    def __init__(self, path: str, rank: int, ranks: int, columns: list[str]):
        import pyarrow.dataset as ds
        if not os.path.exists(path):
            raise DataError(f"--records {path}: no such file or folder; expected Parquet records")
        try:
            dataset = ds.dataset(path, format="parquet")
            groups = [group for fragment in sorted(dataset.get_fragments(), key=lambda f: f.path)
                      for group in fragment.split_by_row_group()]
        except Exception as e:  # pyarrow's ArrowInvalid: not Parquet
            raise DataError(f"--records {path}: {type(e).__name__}: {str(e)[:200]}; expected Parquet records") \
                from None
        missing = [c for c in columns if c not in dataset.schema.names]
        if missing:
            raise DataError(f"--records {path}: no column {', '.join(map(repr, missing))}; the model reads "
                            f"{', '.join(columns)} and the records have {', '.join(dataset.schema.names)}")
        sizes = [group.row_groups[0].num_rows for group in groups]
        starts = list(accumulate(sizes, initial=0))
        self.path, self.columns, self.records = path, columns, sum(sizes)
        self.groups = [(starts[g], sizes[g], groups[g]) for g in range(rank, len(groups), ranks)]
        self.schema = dataset.schema

    def __len__(self) -> int:
        """This rank's records."""
        return sum(size for _, size, _ in self.groups)

    def chunk_count(self, chunk_rows: int) -> int:
        """How many chunks `chunks(chunk_rows)` yields."""
        return sum(-(-size // chunk_rows) for _, size, _ in self.groups)

    def chunks(self, chunk_rows: int):
        """Yield (the first record's index, a pyarrow Table of at most `chunk_rows` records) over this rank's row
        groups in order."""
        for start, _, group in self.groups:
            table = group.to_table(columns=self.columns)
            for offset in range(0, table.num_rows, chunk_rows):
                yield start + offset, table.slice(offset, chunk_rows)

    def empty(self):
        """A table of no records, of the columns read."""
        return self.schema.empty_table().select(self.columns)
