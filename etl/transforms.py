"""Feature and label transforms chosen on the command line, fitted on the train split, recorded in the manifest.

They act on the model-visible values v = stored * scale + offset, in this order:

- `scale`: v -> (v - min) / (max - min) with the train split's global min and max; only the
  manifest's scale/offset change, the stored values stay as they are (uint8 stays uint8).
- `standardize`: v -> (v - mean_f) / std_f per feature f (train split; std 0 counts as 1),
  stored as float32. A sequence column (`--sequence`) is standardized per channel over every step of the train
  split's sequences, unless it holds token ids (non-negative integers only, which an embedding reads): its values
  are stored standardized, never padded, so padding and masks are as before; the manifest's `sequences` entry
  records its `mean` and `std`.
- `binarize`: `threshold` (v >= t) or `stochastic` (1 with probability clip(v, 0, 1), drawn
  from a hash of the seed, the row's key and the feature, so reruns give the same bits),
  stored as uint8 {0, 1}; for Bernoulli RBM inputs. Use `--scale` first for raw data.
- `one_hot`: each shard also gets `y_onehot` (rows, classes) uint8; `y` stays as it is.

A bag column's values (`--bag`) are written as their ids, fitted on the train split as a categorical column's
(`etl/bag_columns.py`); no other transform touches them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mpitrain.base.domains import check_number
from mpitrain.base.errors import ConfigError, DataError
from mpitrain.data.sequences import Ragged
from mpitrain.etl.sequence_columns import StoredSequences
from mpitrain.kernels.activations import splitmix64
from mpitrain.kernels.rows import flat_rows

BINARIZE_MODES = ("threshold", "stochastic")


@dataclass(frozen=True)
class TransformOptions:
    """The transforms asked for on the command line."""

    scale: bool = False
    standardize: bool = False
    binarize: str = ""  # "" (off), "threshold" or "stochastic"
    threshold: float = 0.5
    one_hot: bool = False

    def __post_init__(self):
        check_number("--threshold", self.threshold, "[-1e30, 1e30]")
        if self.binarize not in ("", *BINARIZE_MODES):
            raise ConfigError(f"--binarize {self.binarize!r}: expected one of {BINARIZE_MODES}")
        if self.binarize and self.standardize:
            raise ConfigError("--binarize and --standardize: expected at most one of them "
                              "(binarize expects values in [0, 1], standardize makes them centred)")

    @property
    def needs_stats(self) -> bool:
        return self.scale or self.standardize


def mean_and_std(total, squares, count: int) -> tuple:
    """The mean and standard deviation of `count` values from their sum and sum of squares (per feature when
    arrays); a std of 0 counts as 1, so a constant feature is only centred."""
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean * mean, 0.0))
    return mean, np.where(std > 0, std, 1.0)


@dataclass
class FeatureStats:
    """Sums over the train split's model-visible values: per feature, and their global min and max."""

    rows: int
    total: np.ndarray
    squares: np.ndarray
    low: float
    high: float

    @classmethod
    def of(cls, values: np.ndarray) -> FeatureStats:
        flat = flat_rows(values).astype(np.float64)
        empty = not flat.size
        return cls(len(flat), flat.sum(axis=0), np.square(flat).sum(axis=0),
                   np.inf if empty else float(flat.min()), -np.inf if empty else float(flat.max()))

    def merge(self, other: FeatureStats) -> FeatureStats:
        return FeatureStats(self.rows + other.rows, self.total + other.total, self.squares + other.squares,
                            min(self.low, other.low), max(self.high, other.high))


@dataclass
class StepStats:
    """Sums over the steps of a sequence column's train sequences, per channel, and whether every value is a
    non-negative integer (token ids)."""

    steps: int
    total: np.ndarray
    squares: np.ndarray
    integral: bool

    @classmethod
    def of(cls, values: np.ndarray) -> StepStats:
        values = values.astype(np.float64)
        return cls(len(values), values.sum(axis=0), np.square(values).sum(axis=0),
                   bool(np.all((values >= 0) & (values == np.round(values)))))

    def merge(self, other: StepStats) -> StepStats:
        return StepStats(self.steps + other.steps, self.total + other.total, self.squares + other.squares,
                         self.integral and other.integral)

    @staticmethod
    def of_columns(rows) -> dict[str, StepStats]:
        """Each sequence column's stats of a partition's `SequenceRows`."""
        return {name: StepStats.of(seqs.values) for name, seqs in rows.sequences.items() if isinstance(seqs, Ragged)}

    @staticmethod
    def merge_columns(a: dict[str, StepStats], b: dict[str, StepStats]) -> dict[str, StepStats]:
        return {name: a[name].merge(b[name]) for name in a}


@dataclass
class Transforms:
    """Fitted transforms: stored source values in, stored output values out (see the module docstring)."""

    options: TransformOptions
    seed: int
    source_dtype: str
    source_scale: float
    source_offset: float
    stats: FeatureStats | None = None
    step_stats: dict[str, StepStats] | None = None  # sequence columns, under `standardize`
    bags: dict[str, dict] = field(default_factory=dict)  # each bag column's ids' entry (`etl/tables.py`'s `fit_bags`)
    root: str | None = None  # the folder (or staging URL) being written, where file vocabularies lie

    def __post_init__(self):
        self.low, self.high = (0.0, 1.0)
        if self.options.scale:
            self.low, self.high = self.stats.low, self.stats.high
            if not self.high > self.low:
                raise DataError(f"--scale: every train feature is {self.low}; expected varying values")
        if self.options.standardize:
            self.mean, self.std = mean_and_std(self.stats.total, self.stats.squares, self.stats.rows)
        self.sequence_scaling = {}  # {column: (mean, std) per channel} of the sequence columns standardized
        for name, stats in (self.step_stats or {}).items():
            if self.options.standardize and not stats.integral and stats.steps:
                self.sequence_scaling[name] = mean_and_std(stats.total, stats.squares, stats.steps)
        self.stored = StoredSequences([{"name": name, **self.sequence_entry(name)}
                                       for name in [*self.bags, *self.sequence_scaling]], self.root)

    @property
    def columns(self) -> dict:
        """A table's column groups, the manifest's `columns` (`etl/tables.py`); {} for other features."""
        return {}

    @property
    def feature_dtype(self) -> str:
        return "uint8" if self.options.binarize else "float32" if self.options.standardize else self.source_dtype

    @property
    def scale_offset(self) -> tuple[float, float]:
        """The manifest's scale and offset for the stored output values."""
        if self.options.binarize or self.options.standardize:
            return 1.0, 0.0
        span = self.high - self.low
        return self.source_scale / span, (self.source_offset - self.low) / span

    def apply(self, x: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Stored source values (rows, ...) of rows with shuffle `keys` -> stored output values."""
        if not (self.options.binarize or self.options.standardize):
            return x
        v = flat_rows(x).astype(np.float64) * self.source_scale + self.source_offset
        if self.options.standardize:
            return ((v - self.mean) / self.std).astype(np.float32).reshape(x.shape)
        v = (v - self.low) / (self.high - self.low)
        if self.options.binarize == "threshold":
            bits = v >= self.options.threshold
        else:
            bits = self._uniform(keys, v.shape[1]) < np.clip(v, 0.0, 1.0)
        return bits.astype(np.uint8).reshape(x.shape)

    def apply_ids(self, x) -> np.ndarray | None:
        """A table's categorical ids of stored source rows (`etl/tables.py`), stored beside x; None for other rows."""
        return None

    def apply_sequences(self, sequences: dict) -> dict:
        """A shard's sequence columns ({name: Ragged, or a bag column's TextBags}) as stored: each bag column's ids,
        each standardized column per channel (float32), the others as they are (`StoredSequences` of the columns'
        manifest entries)."""
        return self.stored(sequences)

    def sequence_entry(self, name: str) -> dict:
        """What the manifest's `sequences` entry of column `name` records of its transform: a bag column's ids (its
        vocabulary or hash buckets), or its mean and std per channel when standardized."""
        if name in self.bags:
            return {"bag": True, **{key: value for key, value in self.bags[name].items() if key != "name"}}
        if name not in self.sequence_scaling:
            return {}
        mean, std = self.sequence_scaling[name]
        return {"mean": mean.tolist(), "std": std.tolist()}

    def _uniform(self, keys: np.ndarray, features: int) -> np.ndarray:
        """Uniform [0, 1) per (row, feature) from the seed and the row's key."""
        feature_salt = splitmix64(np.arange(features, dtype=np.uint64) + np.uint64(self.seed) * np.uint64(features))
        with np.errstate(over="ignore"):
            bits = splitmix64(keys[:, None] ^ feature_salt[None, :])
        return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53

    def one_hot(self, y: np.ndarray, num_classes: int) -> dict[str, np.ndarray]:
        """Extra shard datasets: `y_onehot` when asked for."""
        if not self.options.one_hot:
            return {}
        return {"y_onehot": np.eye(num_classes, dtype=np.uint8)[y]}

    def manifest_entries(self) -> list[dict]:
        """What the manifest records: each transform with its fitted parameters."""
        entries = []
        if self.options.scale:
            entries.append({"name": "scale", "min": self.low, "max": self.high})
        if self.options.standardize:
            entries.append({"name": "standardize", "mean": self.mean.tolist(), "std": self.std.tolist()})
        if self.options.binarize == "threshold":
            entries.append({"name": "binarize", "mode": "threshold", "threshold": self.options.threshold})
        elif self.options.binarize:
            entries.append({"name": "binarize", "mode": "stochastic", "seed": self.seed})
        if self.options.one_hot:
            entries.append({"name": "one_hot", "dataset": "y_onehot"})
        return entries
