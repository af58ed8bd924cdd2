"""New raw records of a table model, encoded under MPI: what `mpiexec -n N mpitrain predict RUN --records PATH`
scores (`mpitrain.training.trained.predict_records`).

    rows, tally = encode_records("new/clicks.parquet", manifest.columns, dataset_root, comm)   # a collective
    rows.batches(4096)                     # (Inputs of numbers and ids, zero labels) as a split's `EvalRows` gives

Each rank reads its row groups of the Parquet records (`mpitrain.data.record_share`) and encodes them as the ETL
encoded the training rows (`TableEncoder` of the run's dataset's columns: unseen values get id 1, missing ones 0,
missing numbers the train mean where the columns impute them). A column whose vocabulary is Parquet files is looked
up by the ranks owning its parts (`mpitrain.parallel.vocabulary_lookup`), so the ranks encode as many chunks, one
lookup per column each: a rank out of records encodes an empty one. A record that cannot be encoded (text where a
number belongs, a missing number not imputed) is left out and counted; the first such is named. The encoded rows,
float32 numbers and int32 ids, stay in memory: a few bytes per column and record, far less than the records.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mpitrain.base.errors import ConfigError
from mpitrain.data.encoding import ID_DTYPE, TableEncoder
from mpitrain.data.record_share import RecordShare
from mpitrain.data.sequences import Inputs
from mpitrain.parallel.vocabulary_lookup import SharedVocabulary

CHUNK_ROWS = 65_536  # records encoded at a time


class EncodedRows:
    """This rank's encoded records (`x`, `ids`) and their indices among the records (`index`), as batches."""

    def __init__(self, x: np.ndarray, ids: np.ndarray, index: np.ndarray):
        self.x, self.ids, self.index = x, ids, index

    def __len__(self) -> int:
        return len(self.x)

    def batches(self, batch_size: int):
        """Yield (Inputs of numbers and the `categorical` ids, int32 zero labels) of at most `batch_size` rows."""
        for start in range(0, len(self), batch_size):
            end = min(start + batch_size, len(self))
            yield Inputs(self.x[start:end], {"categorical": self.ids[start:end]}), np.zeros(end - start, np.int32)


class Tally(NamedTuple):
    """The records read over all ranks, those left out, and why the first of them was (or "")."""

    records: int
    bad: int
    first_bad: str


def encode_records(path: str, columns: dict, root: str, comm, chunk_rows: int = CHUNK_ROWS) \
        -> tuple[EncodedRows, Tally]:
    """This rank's share of the Parquet records at `path` encoded by a table's `columns` (its dataset at `root`),
    and the tally over all ranks. A collective."""
    with comm.agreed_errors():
        if not columns:
            raise ConfigError(f"--records {path}: scores a table model's records (a dataset of columns: the ETL's "
                              "--categorical, --numeric-missing impute); this run's dataset has none, so score its "
                              "records with `mpitrain score` (docs/scoring.md)")
        shared = []

        def file_ids(entry):
            shared.append(SharedVocabulary(entry, root, comm))
            return shared[-1]
        encoder = TableEncoder(columns, root, file_ids)
        share = RecordShare(path, comm.rank, comm.size, encoder.numeric + encoder.categorical)
        for vocabulary in shared:
            vocabulary.read_own_parts()  # here, where a missing part is an error on every rank
    xs, ids, index, bad, first_bad = [], [], [], 0, ""
    chunks = share.chunks(chunk_rows)
    for _ in range(int(comm.max(share.chunk_count(chunk_rows)))):
        start, table = next(chunks, (0, share.empty()))
        encoded = encoder.encode(table)
        good = ~encoded.bad
        xs.append(encoded.x[good])
        ids.append(encoded.ids[good].astype(ID_DTYPE, copy=False))
        index.append(start + np.flatnonzero(good))
        if encoded.bad.any():
            bad += int(encoded.bad.sum())
            i = int(np.argmax(encoded.bad))
            first_bad = first_bad or f"record {start + i}: {encoded.problem(i)}"
    rows = EncodedRows(np.concatenate(xs) if xs else np.zeros((0, encoder.width), np.float32),
                       np.concatenate(ids) if ids else np.zeros((0, len(encoder.categorical)), ID_DTYPE),
                       np.concatenate(index) if index else np.zeros(0, np.int64))
    found = [tally for tally in comm.allgather_obj((bad, first_bad)) if tally[0]]
    return rows, Tally(share.records, sum(b for b, _ in found), found[0][1] if found else "")
