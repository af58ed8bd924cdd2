"""What a source's read task hands to the job: a batch of good rows, and its bad records counted.

A bad record (an unparsable line, a missing or non-finite value, a label that does not fit the target,
an image Pillow cannot decode) is dropped from the batch, counted, and the first few are kept
as one-line descriptions, so the job can print a sample and fail above `--max-bad-fraction`.
`Target` says what the label columns hold and turns them into `y`: int32 class labels (rows,), or
float32 (rows, k) for binary, multilabel and regression targets (`mpitrain.data.shards.TARGETS`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpitrain.data.encoding import category_text, numeric_values
from mpitrain.kernels.rows import flat_rows

SAMPLES = 5  # bad records described per batch and in the job's message


@dataclass
class BadRecords:
    """How many records were bad, and descriptions of the first few."""

    count: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, rows, describe) -> None:
        """Count the bad `rows`; `describe(row)` is called for the first few only."""
        self.samples.extend(describe(row) for row in rows[:SAMPLES - len(self.samples)])
        self.count += len(rows)

    def merge(self, other: BadRecords) -> BadRecords:
        self.count += other.count
        self.samples.extend(other.samples[:SAMPLES - len(self.samples)])
        return self


@dataclass(frozen=True)
class Target:
    """What the label columns hold (`--target`): `class` (one column of integers 0..num_classes-1, or of text
    whose values `class_names` lists), `binary` (one column of 0/1), `multilabel` (several columns of 0/1) or
    `regression` (numbers). A missing label, or one of another kind, makes a bad record."""

    kind: str = "class"
    columns: tuple[str, ...] = ()  # the label columns' names ("": a source's only, unnamed label)
    num_classes: int | None = None  # class: None means any integer >= 0 (the job takes the largest + 1)
    class_names: tuple[str, ...] = ()  # class labels that are text: the classes' values, in class order

    @property
    def expected(self) -> str:
        if self.kind == "class":
            if self.class_names:
                names = ", ".join(map(repr, self.class_names[:10]))
                return f"one of {names}{' ...' if len(self.class_names) > 10 else ''}"
            return f"0..{self.num_classes - 1}" if self.num_classes is not None else "an integer >= 0"
        return "0 or 1" if self.kind in ("binary", "multilabel") else "a finite number"

    def check(self, columns: list, where: str, record) -> tuple[np.ndarray, np.ndarray, object]:
        """Label columns (numpy or pyarrow arrays, one per `columns` name) -> (y of every row, which rows' labels
        fit, describe(row) of a row whose labels do not). `record(i)` names row i in messages."""
        rows = len(columns[0])
        values = np.empty((rows, len(columns)))
        for j, column in enumerate(columns):
            name = self.columns[j] if j < len(self.columns) else ""
            if isinstance(column, np.ndarray):
                values[:, j] = column
            elif self.class_names:
                import pyarrow as pa
                import pyarrow.compute as pc
                index = pc.index_in(category_text(column, name), value_set=pa.array(self.class_names, pa.string()))
                values[:, j] = pc.fill_null(index.cast(pa.float64()), np.nan).to_numpy(zero_copy_only=False)
            else:
                values[:, j] = numeric_values(column, name)[0]  # text that is not a number: NaN, a bad label
        if self.kind == "class":
            ok = (values >= 0) & (values == np.floor(values))
            if self.num_classes is not None:
                ok &= values < self.num_classes
        elif self.kind in ("binary", "multilabel"):
            ok = (values == 0) | (values == 1)
        else:
            ok = np.isfinite(values)
        row_ok = ok.all(axis=1)

        def describe(i: int) -> str:
            j = int(np.flatnonzero(~ok[i])[0])
            column = columns[j]
            value = column[i] if isinstance(column, np.ndarray) else column[i].as_py()
            named = f" (column {self.columns[j]!r})" if j < len(self.columns) and self.columns[j] else ""
            shown = "missing" if value is None else repr(value) if isinstance(value, str) else value
            return f"{where}: label {shown} at record {record(i)}, expected {self.expected}{named}"

        if self.kind == "class":
            y = np.where(row_ok, values[:, 0], -1).astype(np.int32)
        else:
            y = np.where(row_ok[:, None], values, 0).astype(np.float32)
        return y, row_ok, describe


@dataclass
class ReadBatch:
    """Good rows read by one task: features (rows, *feature_shape; a table's `TableRows` until the job encodes
    them) and labels (int32 (rows,) class labels, -1: unlabeled; float32 (rows, k) other targets); `seen`
    counts bad ones too; `kept` are the good rows' positions in the record batch they came from (scoring
    copies their key columns)."""

    x: np.ndarray
    y: np.ndarray
    seen: int
    bad: BadRecords
    kept: np.ndarray | None = None


def checked_batch(x: np.ndarray, labels, num_classes: int | None, where: str, record,
                  bad: BadRecords | None = None, feature_dtype: str | None = None,
                  positions: np.ndarray | None = None, target: Target | None = None) -> ReadBatch:
    """Keep the rows whose labels fit the target and whose features are finite (and fit `feature_dtype`).

    `labels`: one array of class labels 0..num_classes-1 (num_classes None: any integer >= 0), or
    with `target` a list of its label columns; None: unlabeled rows (scoring), labelled -1.
    `record(i)` names row i in messages (a record number, the leading values); `bad` holds records
    the source already rejected. Features are converted to `feature_dtype` (default: unchanged).
    `positions`: each row's position in its record batch (default 0, 1, ...), kept for the good rows.
    """
    bad = bad or BadRecords()
    label_ok = np.ones(len(x), bool)
    y = np.full(len(x), -1, np.int32)
    if labels is not None:
        y, label_ok, describe = target.check(labels, where, record) if target else \
            Target(num_classes=num_classes).check([np.asarray(labels)], where, record)
        bad.add(np.flatnonzero(~label_ok), describe)
    features = flat_rows(x)
    feature_ok = np.ones(len(x), bool)
    if feature_dtype == "uint8" and features.dtype != np.uint8:  # NaN and Inf fail these comparisons too
        feature_ok = ((features >= 0) & (features <= 255) & (features == np.floor(features))).all(axis=1)
    elif features.dtype.kind == "f":
        feature_ok = np.isfinite(features).all(axis=1)
    wanted = "integers 0..255" if feature_dtype == "uint8" else "finite numbers"
    bad.add(np.flatnonzero(label_ok & ~feature_ok),
            lambda i: f"{where}: a missing or invalid feature at record {record(i)}, expected {wanted}")
    good = label_ok & feature_ok
    x = x[good] if not good.all() else x
    y = y[good]
    kept = np.flatnonzero(good) if positions is None else np.asarray(positions)[good]
    return ReadBatch(x.astype(feature_dtype or x.dtype, copy=False), y, len(good), bad, kept)
