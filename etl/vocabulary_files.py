"""The Parquet parts of a vocabulary larger than --max-vocabulary (`--vocabulary-files`), written by the Spark task
that counted their values into the job's temporary folder or staging prefix (the layout and the ids:
`mpitrain.data.vocabulary_files`)."""
from __future__ import annotations

import io
import os
import posixpath
from urllib.parse import quote

import numpy as np

from mpitrain.data.storage import is_url, open_storage
from mpitrain.data.vocabulary_files import part_path

VOCABULARIES = "vocabularies"  # the folder of the file vocabularies, beside manifest.json


def vocabulary_folder(column: str) -> str:
    """The relative folder of `column`'s file vocabulary: its name, %-quoted to one path component."""
    return f"{VOCABULARIES}/{quote(column, safe='')}"


def write_part(root: str, folder: str, part: int, values, counts: np.ndarray, first_id: int) -> int:
    """Write part `part` of a vocabulary: `values` (a pyarrow string array) sorted by text with their train counts,
    ids from `first_id`, into `root` (a local folder or a staging URL). Returns the values written."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    order = pc.sort_indices(values)
    table = pa.table({"value": values.take(order), "id": np.arange(first_id, first_id + len(values), dtype=np.int64),
                      "count": np.asarray(counts, np.int64)[order.to_numpy()]})
    relative = part_path(folder, part)
    if is_url(root):
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        store = open_storage(root)
        store.fs.pipe_file(posixpath.join(store.root, relative), buffer.getvalue())
    else:
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(table, path)
    return len(values)
