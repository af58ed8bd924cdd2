"""A file vocabulary shared out among ranks: each rank reads only the parts it owns and answers for their values.

    ids = SharedVocabulary(entry, dataset_root, comm)
    column_ids = ids(texts)          # a collective: every rank calls it as often, in the same order

Part p of a column's file vocabulary (`mpitrain.data.vocabulary_files`) belongs to rank p mod ranks. A lookup sends
each distinct value to the rank owning its part (an Alltoallv of the values' byte lengths, then one of their UTF-8
bytes), the owner finds it in its part (reading the part once, when first asked), and the ids go back (an Alltoallv
whose sizes both sides know). No rank reads a part it does not own; a rank holds its parts' values, a share of the
vocabulary. This is how `mpiexec -n N mpitrain predict RUN --records PATH` encodes new records of a column whose
vocabulary no single process should load.
"""
from __future__ import annotations

import numpy as np

from mpitrain.data.encoding import MISSING_ID, string_buffers
from mpitrain.data.vocabulary_files import FileVocabulary, parts_of


class SharedVocabulary:
    """The ids of a file-vocabulary column's values, looked up by the ranks owning their parts (a collective)."""

    def __init__(self, entry: dict, root: str, comm):
        self.own = FileVocabulary(entry, root)  # asked only for values of this rank's parts
        self.parts, self.comm = entry["vocabulary_parts"], comm

    def read_own_parts(self) -> None:
        """Read every part this rank owns now (a missing or broken one is a DataError here, not inside a lookup the
        other ranks wait in). Not a collective."""
        for part in range(self.comm.rank, self.parts, self.comm.size):
            self.own.part(part)

    def __call__(self, texts) -> np.ndarray:
        """int64 ids of `texts` (a pyarrow string array, null where missing): 0 missing, 1 unseen, else the value's.
        A collective: a rank with no values calls it with an empty array."""
        import pyarrow as pa
        import pyarrow.compute as pc
        texts = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        distinct = pc.unique(texts.drop_null())
        owner = parts_of(distinct, self.parts) % self.comm.size
        order = np.argsort(owner, kind="stable")
        distinct, owner = distinct.take(pa.array(order)), owner[order]
        counts = np.bincount(owner, minlength=self.comm.size)
        lengths = pc.binary_length(distinct).to_numpy(zero_copy_only=False).astype(np.int64)
        their_lengths = self.comm.alltoallv(lengths, counts)
        their_bytes = self.comm.alltoallv(_utf8(distinct), np.bincount(owner, lengths, self.comm.size).astype(np.int64))
        asked = np.concatenate(their_lengths)
        offsets = np.concatenate([[0], np.cumsum(asked)]).astype(np.int32)
        received = pa.StringArray.from_buffers(len(asked), pa.py_buffer(offsets),
                                               pa.py_buffer(np.concatenate(their_bytes)))
        answers = self.own(received)
        found = np.concatenate(self.comm.alltoallv(answers, [len(part) for part in their_lengths], received=counts))
        place = pc.index_in(texts, value_set=distinct).to_numpy(zero_copy_only=False)
        missing = texts.is_null().to_numpy(zero_copy_only=False)
        ids = np.full(len(texts), MISSING_ID, np.int64)
        ids[~missing] = found[place[~missing].astype(np.int64)]
        return ids


def _utf8(strings) -> np.ndarray:
    """The UTF-8 bytes of a pyarrow string array's values, back to back (uint8)."""
    offsets, data = string_buffers(strings)
    return data[offsets[0]:offsets[-1]].copy()
