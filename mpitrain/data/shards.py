"""The dataset format: one module for the writer (`mpitrain.etl`) and the reader (`mpitrain.data.reader`).

A dataset is a folder holding `manifest.json` and, per split, HDF5 shards
`SPLIT/shard-NNNNN.h5` with datasets `x` (rows, *feature_shape) and `y` (rows,) int32,
chunked by rows, and for a table with categorical columns `ids` (rows, columns) of the
manifest's `id_dtype`: ids are integers end to end, never floats. The manifest is written
last: it is the commit point of an ETL run.

Every dataset of a shard is written in chunks of `CHUNK_ROWS` rows, each chunk with HDF5's
Fletcher-32 checksum (HDF5 verifies a chunk when it reads it and raises OSError on a
mismatch) and optionally compressed (`COMPRESSIONS`: gzip is HDF5's own deflate, lz4 and
zstd are hdf5plugin's filters). Importing this module imports hdf5plugin, which registers
those filters with HDF5, so any reader that imports it decodes every codec.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field

import h5py
import hdf5plugin  # registers the lz4 and zstd filters with HDF5 before any shard is opened
import numpy as np

from mpitrain.base.errors import DataError, describe
from mpitrain.base.files import write_file, write_hdf5
from mpitrain.base.paths import confined
from mpitrain.data.encoding import ID_DTYPE, MAX_IDS, TOKEN_IDS, CategoryIds
from mpitrain.data.vocabulary_files import check_file_entry
from mpitrain.data.storage import Storage, sha256_of

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
FEATURE_DTYPES = ("uint8", "float32")
CHUNK_ROWS = 1024
# The most rows a manifest may list for one shard (the ETL writes far fewer: a split's rows over --shards). A count
# beyond it is an edited manifest, refused before the reader plans an epoch of so many chunks.
MAX_SHARD_ROWS = 1 << 31
COMPRESSIONS = ("none", "gzip", "lz4", "zstd")
CHECKSUMS = ("", "fletcher32")
# What `y` holds: class labels 0..num_classes-1 (int32, (rows,)); one 0/1 outcome (binary, float32 (rows, 1)); several
# 0/1 labels (multilabel, float32 (rows, k)); numbers (regression, float32 (rows, k)). k: len(target_names).
TARGETS = ("class", "binary", "multilabel", "regression")  # "": only the whole-file sha256 (manifests written before per-chunk checksums)
GZIP_LEVEL = 4
# A table's column groups, in the order their columns sit in a row of `x` (see `Manifest.columns`).
COLUMN_GROUPS = ("numeric", "categorical")
# Ids (a categorical column's, a bag's) are stored as ID_DTYPE integers (`mpitrain.data.encoding`), in a shard's `ids`
# and a bag column's values. Datasets written before (ids in float32 `x`, exact below 2**24) are refused with how to
# write them again:
OLD_IDS = ("its ids are stored in float32 x, as an earlier mpitrain wrote them (exact only below 2**24); expected a "
           "dataset written by this mpitrain's ETL: run `mpitrain etl` (or the spark-submit job) on the source again")


@dataclass(frozen=True)
class ShardInfo:
    """One shard as the manifest lists it; `path` is relative to the dataset folder."""

    path: str
    rows: int
    sha256: str


@dataclass
class Manifest:
    """The parsed `manifest.json`; `splits` maps a split name to its shards in order."""

    feature_shape: tuple[int, ...]
    feature_dtype: str
    scale: float
    offset: float
    mean: float
    std: float
    num_classes: int
    label_counts: dict[str, list[int]]
    splits: dict[str, list[ShardInfo]]
    schema_version: int = SCHEMA_VERSION
    source: str = ""
    seed: int = 0
    transforms: list[dict] = field(default_factory=list)  # {"name": ..., fitted parameters}, in applied order
    class_names: list[str] = field(default_factory=list)  # empty: the classes are known by index only
    bad_records: int = 0  # records the ETL dropped (at most --max-bad-fraction of them)
    compression: str = "none"  # the shards' HDF5 codec, one of COMPRESSIONS
    chunk_rows: int = CHUNK_ROWS  # rows per HDF5 chunk
    checksums: str = ""  # "fletcher32": every chunk carries one; "": only the whole-file sha256
    target: str = "class"  # what `y` holds, one of TARGETS
    target_names: list[str] = field(default_factory=list)  # binary, multilabel, regression: y's columns, named
    # A table's columns by group ({} for images and plain numeric rows): {"numeric": [COLUMN, ...], "categorical":
    # [COLUMN, ...]}. x is float32 (rows, numeric), and a shard's `ids` (rows, categorical) holds one id per
    # categorical column, 0..ids-1, as `id_dtype` integers. A column is {"name", ...how the ETL encoded it}:
    # categorical ones have "ids" (how many) and a "vocabulary" (id 0: missing, 1: out of vocabulary, 2+i: the
    # i-th value), a "vocabulary_path" to Parquet parts beside the manifest (mpitrain.data.vocabulary_files), or
    # "hash_buckets" (id 0: missing, 1 + hash mod buckets); numeric ones may have "mean"/"std"
    # (standardized) and "impute" (the value a missing one got); an indicator column has "missing_of".
    columns: dict[str, list[dict]] = field(default_factory=dict)
    # Sequence columns (docs/sequences.md), each {"name", "features": F, "max_length": the longest allowed, "longest"
    # and "shortest" written, "steps": per split, and "ids" (the largest value + 1) for a column of token ids}: stored ragged in each shard as `sequences/NAME/values` (steps, F) float32 and
    # `sequences/NAME/offsets` (rows + 1,) int64. Then x holds the fixed features only ((rows, 0) without any).
    sequences: list[dict] = field(default_factory=list)
    # A class per step (sequence labelling): the label column stored ragged like a sequence column (1 feature, the
    # first sequence column's lengths) as `sequences/NAME/...`; then y holds each row's largest step class (what
    # carving stratifies by and `label_counts` counts). "": one target per row, in y.
    step_target: str = ""
    # A regression target's mean and standard deviation per column of y, over the train split's rows as stored (std
    # 0 counts as 1): what `data.standardize_targets` trains on (`mpitrain.data.units`). Empty for other targets, and
    # in a manifest written before the ETL recorded them.
    target_mean: list[float] = field(default_factory=list)
    target_std: list[float] = field(default_factory=list)
    # The integer dtype of the ids (ID_DTYPE) of a dataset with categorical or bag columns, "" without any.
    id_dtype: str = ""

    @property
    def input_shape(self) -> tuple:
        """What a model reads of a row: the shape of x, or `(None, F)` for a dataset of one sequence column and no
        fixed features (a sequence of any length of F-vectors)."""
        if self.sequences and self.feature_shape == (0,) and len(self.sequences) == 1:
            return (None, self.sequences[0]["features"])
        return tuple(self.feature_shape)

    @property
    def sequence_inputs(self) -> dict[str, tuple]:
        """Each sequence column as a graph model's input of its name, {name: (None, F)} (docs/sequences.md)."""
        return {column["name"]: (None, column["features"]) for column in self.sequences}

    @property
    def stored_sequences(self) -> list[dict]:
        """Every ragged column of a shard, {name, features}: the sequence columns, then the step target if any."""
        return self.sequences + ([{"name": self.step_target, "features": 1}] if self.step_target else [])

    @property
    def ids_dtype(self) -> np.dtype:
        """The dtype of a shard's `ids` and a bag's values: `id_dtype`, ID_DTYPE for a dataset without ids (whose
        `ids` are (rows, 0))."""
        return np.dtype(self.id_dtype or ID_DTYPE)

    def values_dtype(self, column: dict) -> np.dtype:
        """The dtype a stored (ragged) column's values have: `id_dtype` for a bag's ids and a column of integers
        (`integer`: token ids), else float32."""
        return self.ids_dtype if column.get("bag") or column.get("integer") else np.dtype(np.float32)

    @property
    def target_shape(self) -> tuple[int, ...]:
        """One row's `y` shape: () for class labels, (k,) for the other targets."""
        return () if self.target == "class" else (max(1, len(self.target_names)),)

    @property
    def target_dtype(self):
        return np.dtype(np.int32 if self.target == "class" else np.float32)

    @property
    def input_groups(self) -> dict[str, InputGroup]:
        """The model's named inputs of a row: `numeric`, the row of x (its numbers; without `columns` the whole row,
        of `feature_shape`: an image stays an image), and `categorical`, the row of `ids` (`InputGroup.ids`: how
        many ids each column has). Sequence columns: `sequence_inputs`."""
        numeric = self.columns.get("numeric", []) if self.columns else None
        groups = {} if self.feature_shape == (0,) else \
            {"numeric": InputGroup(0, (len(numeric),) if numeric is not None else tuple(self.feature_shape))}
        if self.id_columns:
            groups["categorical"] = InputGroup(0, (self.id_columns,), tuple(c["ids"] for c in self.columns["categorical"]))
        return groups

    @property
    def id_columns(self) -> int:
        """The categorical columns of a row: the width of a shard's `ids` (0: it has none)."""
        return len(self.columns.get("categorical", []))

    @property
    def outputs(self) -> int:
        """The model's output units: one per class, else one per target column."""
        return self.num_classes if self.target == "class" else self.target_shape[0]

    def rows(self, split: str) -> int:
        return sum(shard.rows for shard in self.shards(split))

    def shards(self, split: str) -> list[ShardInfo]:
        if split not in self.splits:
            raise DataError(f"{MANIFEST_NAME}: no split {split!r}; the dataset has {sorted(self.splits)}")
        return self.splits[split]

    def to_json(self) -> dict:
        data = asdict(self)
        data["feature_shape"] = list(self.feature_shape)
        data["splits"] = {name: {"rows": self.rows(name), "shards": [asdict(s) for s in shards]}
                          for name, shards in self.splits.items()}
        return data


@dataclass(frozen=True)
class InputGroup:
    """A named model input: `shape` values of a row of `x` from `start` on, or with `ids` (categorical: how many
    ids each of its columns has) the row of `ids`."""

    start: int
    shape: tuple[int, ...]
    ids: tuple[int, ...] = ()

    @property
    def stop(self) -> int:
        return self.start + math.prod(self.shape)


def shard_path(split: str, index: int) -> str:
    """Relative path of shard `index` of `split`."""
    return f"{split}/shard-{index:05d}.h5"


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return sha256_of(f)


def _filters(compression: str) -> dict:
    """h5py's create_dataset arguments of a codec, the Fletcher-32 checksum included."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression {compression!r}, expected one of {COMPRESSIONS}")
    codec = {"none": {}, "gzip": {"compression": "gzip", "compression_opts": GZIP_LEVEL},
             "lz4": dict(hdf5plugin.LZ4()), "zstd": dict(hdf5plugin.Zstd())}[compression]
    return {**codec, "shuffle": compression != "none", "fletcher32": True}


def write_shard(dataset_dir: str, relative_path: str, x: np.ndarray, y: np.ndarray,
                extras: dict[str, np.ndarray] | None = None, compression: str = "none",
                sequences: dict | None = None, ids: np.ndarray | None = None) -> ShardInfo:
    """Write one shard and return its manifest entry (rows and sha256 of the file).

    `ids` (rows, categorical columns), a table's categorical ids, are stored as ID_DTYPE integers (`ids`).
    `extras` are further per-row datasets (e.g. `y_onehot`), chunked like `x`; readers may ignore them.
    Every chunk gets a Fletcher-32 checksum and is compressed with `compression` (one of COMPRESSIONS);
    byte shuffling goes before a codec, so float32 features compress too. `sequences` ({name: `Ragged`}) are stored
    as `sequences/NAME/values` (chunks of `CHUNK_ROWS` steps) and `sequences/NAME/offsets`.
    """
    if len(x) != len(y):
        raise ValueError(f"{relative_path}: {len(x)} feature rows but {len(y)} labels")
    if x.dtype.name not in FEATURE_DTYPES:
        raise ValueError(f"{relative_path}: feature dtype {x.dtype}, expected one of {FEATURE_DTYPES}")
    if ids is not None and (ids.dtype.kind not in "iu" or ids.shape[:1] != (len(x),) or ids.ndim != 2):
        raise ValueError(f"{relative_path}: ids {ids.dtype}{list(ids.shape)}, expected integers ({len(x)}, columns)")
    rows = len(x)
    filters = _filters(compression)

    def fill(f):
        labels = y.astype(np.int32) if y.ndim == 1 else y.astype(np.float32)  # class labels, else target columns
        stored = {"x": x, "y": labels, **({} if ids is None else {"ids": ids.astype(ID_DTYPE)}), **(extras or {})}
        for name, seqs in (sequences or {}).items():
            values = seqs.values  # a bag column's ids stay integers
            stored[f"sequences/{name}/values"] = values.astype(ID_DTYPE if values.dtype.kind in "iu" else np.float32)
            stored[f"sequences/{name}/offsets"] = seqs.offsets.astype(np.int64, copy=False)
        for name, data in stored.items():
            if data.size:  # an empty dataset cannot be chunked, so it has no filters
                f.create_dataset(name, data=data, chunks=(min(len(data), CHUNK_ROWS), *data.shape[1:]), **filters)
            else:
                f.create_dataset(name, data=data)
        f.attrs["rows"] = rows
        f.attrs["schema_version"] = SCHEMA_VERSION
    content = write_hdf5(os.path.join(dataset_dir, relative_path), fill)  # whole or absent
    return ShardInfo(relative_path, rows, hashlib.sha256(content).hexdigest())


def manifest_bytes(manifest: Manifest) -> bytes:
    """The text of `manifest.json` (indented JSON, UTF-8)."""
    return json.dumps(manifest.to_json(), indent=2).encode()


def write_manifest(dataset_dir: str, manifest: Manifest) -> None:
    """Write the manifest whole or not at all (`mpitrain.base.files.write_file`)."""
    write_file(os.path.join(dataset_dir, MANIFEST_NAME), lambda f: f.write(manifest_bytes(manifest)), binary=True)


def read_manifest(dataset_dir: str, storage: Storage | None = None) -> Manifest:
    """Read and validate `DATASET_DIR/manifest.json` (from `storage` when given: a folder or an object store); every
    problem names the file and key."""
    return read_manifest_and_sha256(dataset_dir, storage)[0]


def read_manifest_and_sha256(dataset_dir: str, storage: Storage | None = None) -> tuple[Manifest, str]:
    """`read_manifest`, and the sha256 of the manifest's bytes (the dataset's identity), from one read."""
    storage = storage or Storage(dataset_dir)
    path = storage.path(MANIFEST_NAME)
    if not storage.is_folder_or_absent():
        raise DataError(f"{dataset_dir}: is a file; expected a dataset folder written by `mpitrain etl`")
    try:
        raw = storage.read_bytes(MANIFEST_NAME)
        data = json.loads(raw)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; expected a dataset folder written by `mpitrain etl`") from None
    except OSError as e:
        raise DataError(f"{path}: {describe(e)}; expected a readable manifest written by `mpitrain etl`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: a JSON {type(data).__name__}, expected an object of manifest keys")

    def need(key, kind):
        if key not in data:
            raise DataError(f"{path}: missing key {key!r}")
        value = data[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise DataError(f"{path}: key {key!r} is {value!r}, expected {kind.__name__ if isinstance(kind, type) else 'a number'}")
        return value

    version = need("schema_version", int)
    if version != SCHEMA_VERSION:
        raise DataError(f"{path}: schema_version {version}, this mpitrain reads {SCHEMA_VERSION}")
    shape = need("feature_shape", list)
    sequences = _checked_sequences(data.get("sequences", []), path)
    if (not shape or not all(isinstance(d, int) and d > 0 for d in shape)) and shape != [0]:
        raise DataError(f"{path}: feature_shape {shape!r}, expected a list of positive integers")
    dtype = need("feature_dtype", str)
    if dtype not in FEATURE_DTYPES:
        raise DataError(f"{path}: feature_dtype {dtype!r}, expected one of {FEATURE_DTYPES}")
    target = data.get("target", "class")
    if target not in TARGETS:
        raise DataError(f"{path}: target {target!r}, expected one of {TARGETS}")
    target_names = data.get("target_names", [])
    if not isinstance(target_names, list) or (target in ("multilabel", "regression") and not target_names):
        raise DataError(f"{path}: target_names {target_names!r}, expected the names of y's columns for a "
                        f"{target} target")
    num_classes = need("num_classes", int)
    if target == "class" and num_classes < 2:
        raise DataError(f"{path}: num_classes {num_classes}, expected at least 2")
    numbers = {key: float(need(key, (int, float))) for key in ("scale", "offset", "mean", "std")}
    if not all(math.isfinite(v) for v in numbers.values()) or numbers["std"] <= 0:
        raise DataError(f"{path}: scale/offset/mean/std {numbers}, expected finite numbers and std > 0")
    class_names = data.get("class_names", [])
    if class_names and len(class_names) != num_classes:
        raise DataError(f"{path}: class_names has {len(class_names)} names, expected num_classes {num_classes}")
    compression = data.get("compression", "none")
    if compression not in COMPRESSIONS:
        raise DataError(f"{path}: compression {compression!r}, expected one of {COMPRESSIONS}")
    chunk_rows = data.get("chunk_rows", CHUNK_ROWS)
    if not isinstance(chunk_rows, int) or isinstance(chunk_rows, bool) or chunk_rows < 1:
        raise DataError(f"{path}: chunk_rows {chunk_rows!r}, expected an integer >= 1")
    checksums = data.get("checksums", "")
    if checksums not in CHECKSUMS:
        raise DataError(f"{path}: checksums {checksums!r}, expected one of {CHECKSUMS}")
    id_dtype = data.get("id_dtype", "")
    raw_columns = data.get("columns", {})
    if holds_ids(raw_columns if isinstance(raw_columns, dict) else {}, sequences):
        if id_dtype == "":
            raise DataError(f"{path}: {OLD_IDS}")
        if id_dtype != ID_DTYPE:
            raise DataError(f"{path}: id_dtype {id_dtype!r}, expected {ID_DTYPE!r}")
    elif id_dtype != "":
        raise DataError(f"{path}: id_dtype {id_dtype!r}, expected \"\" (the dataset has no categorical, bag or "
                        "integer columns)")
    columns = _checked_columns(raw_columns, path, tuple(shape), dtype)
    if shape == [0] and not sequences and not columns.get("categorical"):
        raise DataError(f"{path}: feature_shape [0], expected a list of positive integers (rows of no features are "
                        "only a dataset's of sequence or categorical columns)")
    splits = {}
    for name, split in need("splits", dict).items():
        try:
            splits[name] = [ShardInfo(s["path"], int(s["rows"]), str(s["sha256"])) for s in split["shards"]]
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{path}: splits.{name}.shards, expected a list of {{path, rows, sha256}}") from None
    for name, split in data["splits"].items():
        for i, shard in enumerate(split["shards"]):  # a shard's rows order the epoch before its file is opened
            rows = shard["rows"]
            if not isinstance(rows, int) or isinstance(rows, bool) or not 0 <= rows <= MAX_SHARD_ROWS:
                raise DataError(f"{path}: splits.{name}.shards[{i}].rows is {rows!r}, expected an integer "
                                f"0..{MAX_SHARD_ROWS} (the rows of {shard['path']})")
    for name, shards in splits.items():  # nothing outside the dataset is read (mpitrain/base/paths.py)
        for i, shard in enumerate(shards):
            confined(shard.path, path, f"splits.{name}.shards[{i}].path")
    return Manifest(
        feature_shape=tuple(shape), feature_dtype=dtype, num_classes=num_classes,
        label_counts={k: list(v) for k, v in need("label_counts", dict).items()},
        splits=splits, schema_version=version, source=str(data.get("source", "")),
        seed=int(data.get("seed", 0)), transforms=list(data.get("transforms", [])),
        class_names=[str(name) for name in class_names], bad_records=int(data.get("bad_records", 0)),
        compression=compression, chunk_rows=chunk_rows, checksums=checksums, target=target,
        target_names=[str(name) for name in target_names], columns=columns, sequences=sequences,
        step_target=_checked_step_target(data.get("step_target", ""), path, sequences, target), id_dtype=id_dtype,
        **_checked_target_statistics(data, path, target, target_names), **numbers), hashlib.sha256(raw).hexdigest()


def holds_ids(columns: dict, sequences: list[dict]) -> bool:
    """Whether a dataset of these `columns` and `sequences` (the manifest's) stores ids, of `id_dtype`: categorical
    columns, bag columns or sequence columns of integers."""
    return bool(columns.get("categorical")) or any(c.get("bag") or c.get("integer") for c in sequences)


def _checked_sequences(sequences, path: str) -> list[dict]:
    """The manifest's `sequences`, checked: a list of {name, features >= 1, max_length >= 1, longest, shortest, ids},
    a bag column's (`bag: true`: one id per step, its vocabulary or hash buckets) with shortest 0 allowed (an empty
    bag)."""
    def count(value, most: float = math.inf, least: int = 1) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most
    if not isinstance(sequences, list) or not all(
            isinstance(s, dict) and isinstance(s.get("name"), str) and count(s.get("features"))
            and count(s.get("max_length")) and count(s.get("longest", 1), least=0)
            and count(s.get("shortest", 1), least=0 if s.get("bag") else 1)
            and count(s.get("ids", 1), MAX_IDS if s.get("bag") or s.get("integer") else TOKEN_IDS)
            and s.get("integer", False) in (True, False) for s in sequences):
        raise DataError(f"{path}: sequences {str(sequences)[:200]}, expected [{{name, features, max_length, "
                        f"longest, shortest, ids, integer}}, ...] with positive integers (ids at most {TOKEN_IDS}, a "
                        f"bag's or integer column's {MAX_IDS}; shortest 0 for a bag column; integer true or false)")
    for column in sequences:
        if column.get("bag", False) is not False:
            if column["bag"] is not True or column["features"] != 1:
                raise DataError(f"{path}: sequences {column['name']!r}: bag {column['bag']!r} of {column['features']} "
                                "features per step, expected bag true of one id per step")
            CategoryIds(column, f"{path}: sequences", root="")  # the entry checked; nothing is looked up
    return sequences


def _checked_step_target(name, path: str, sequences: list[dict], target: str) -> str:
    """The manifest's `step_target`: "" or a name, of a class target of a dataset with sequence columns."""
    if name != "" and not (isinstance(name, str) and sequences and target == "class"):
        raise DataError(f"{path}: step_target {name!r}, expected \"\" or the name of a class label column of a "
                        "dataset with sequences")
    return name


def _checked_target_statistics(data: dict, path: str, target: str, target_names: list) -> dict[str, list[float]]:
    """The manifest's `target_mean` and `target_std`: both absent or empty, or (a regression target) one finite
    number per target column each, the std's positive."""
    mean, std = data.get("target_mean", []), data.get("target_std", [])
    if mean == [] and std == []:
        return {}

    def numbers(values, low: float = -math.inf) -> bool:
        return isinstance(values, list) and len(values) == len(target_names) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > low for v in values)
    if target != "regression" or not numbers(mean) or not numbers(std, 0.0):
        raise DataError(f"{path}: target_mean {str(mean)[:100]} and target_std {str(std)[:100]}, expected both empty, "
                        f"or for a regression target one finite number per target column each "
                        f"({len(target_names)}), the std's positive")
    return {"target_mean": [float(v) for v in mean], "target_std": [float(v) for v in std]}


def _checked_columns(columns, path: str, feature_shape: tuple[int, ...], feature_dtype: str) -> dict[str, list[dict]]:
    """The manifest's `columns`, checked: known groups of named columns, categorical ones with 1..MAX_IDS ids, the
    numeric ones as many as a row of float32 `x` has values."""
    if not isinstance(columns, dict) or not set(columns) <= set(COLUMN_GROUPS) or not all(
            isinstance(group, list) and all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in group)
            for group in columns.values()):
        raise DataError(f"{path}: columns {str(columns)[:200]}, expected {{GROUP: [{{name, ...}}, ...]}} with "
                        f"GROUP one of {COLUMN_GROUPS}")
    for column in columns.get("categorical", []):
        ids = column.get("ids")
        if not isinstance(ids, int) or isinstance(ids, bool) or not 1 <= ids <= MAX_IDS:
            raise DataError(f"{path}: columns.categorical {column['name']!r} has ids {ids!r}, expected an integer "
                            f"1..{MAX_IDS}")
        if "vocabulary_path" in column:
            check_file_entry(column, f"{path}: columns.categorical")
    width = len(columns.get("numeric", []))
    if columns and (feature_shape != (width,) or feature_dtype != "float32"):
        raise DataError(f"{path}: columns name {width} numeric columns, expected feature_shape [{width}] and "
                        f"feature_dtype float32 (it says {list(feature_shape)} {feature_dtype})")
    return {name: group for name, group in columns.items() if group}


def check_shard(dataset: str | Storage, manifest: Manifest, shard: ShardInfo, verify_checksum: bool) -> str:
    """Validate a shard of the dataset (a folder, a URL or its Storage) against the manifest: it exists, its sha256
    (with `verify_checksum`), its shapes and dtypes. Returns its path."""
    storage = dataset if isinstance(dataset, Storage) else Storage(dataset)
    path = storage.path(shard.path)
    if not storage.exists(shard.path):
        raise DataError(f"{path}: shard listed in {MANIFEST_NAME} is missing")
    if verify_checksum:
        verify_sha256(storage, shard)
    try:
        local = storage.local_path(shard.path)
        with (h5py.File(local, "r") if local else h5py.File(storage.open(shard.path), "r")) as f:
            check_structure(f, path, manifest, shard)
    except OSError as e:
        raise DataError(f"{path}: not a readable shard with datasets 'x' and 'y' ({e})") from None
    return path


def verify_sha256(storage: Storage, shard: ShardInfo) -> None:
    """The whole shard file's sha256 is the manifest's, else one DataError naming the file."""
    path = storage.path(shard.path)
    try:
        actual = storage.sha256(shard.path)
    except FileNotFoundError:
        raise DataError(f"{path}: shard listed in {MANIFEST_NAME} is missing") from None
    except OSError as e:
        raise DataError(f"{path}: {describe(e)}; expected a readable shard") from None
    if actual != shard.sha256:
        raise DataError(f"{path}: sha256 {actual} does not match {MANIFEST_NAME} ({shard.sha256}); "
                        "the shard is corrupt or was replaced")


def check_structure(f: h5py.File, path: str, manifest: Manifest, shard: ShardInfo) -> None:
    """The open shard `f` holds datasets x and y of the shapes and dtypes the manifest says, else a DataError."""
    if "x" not in f or "y" not in f:
        raise DataError(f"{path}: not a shard with datasets 'x' and 'y' (it has {sorted(f)})")
    x, y = f["x"], f["y"]
    expected_x = (shard.rows, *manifest.feature_shape)
    if x.shape != expected_x or x.dtype.name != manifest.feature_dtype:
        raise DataError(f"{path}: dataset 'x' is {x.dtype}{list(x.shape)}, "
                        f"expected {manifest.feature_dtype}{list(expected_x)}")
    for column in manifest.stored_sequences:
        values, offsets = f.get(f"sequences/{column['name']}/values"), f.get(f"sequences/{column['name']}/offsets")
        dtype = manifest.values_dtype(column)
        if values is None or offsets is None or values.ndim != 2 or values.shape[1] != column["features"] or \
                values.dtype != dtype or offsets.shape != (shard.rows + 1,):
            raise DataError(f"{path}: sequence column {column['name']!r} is not stored as the manifest says; expected "
                            f"datasets sequences/{column['name']}/values {dtype}(steps, {column['features']}) and "
                            f"sequences/{column['name']}/offsets ({shard.rows + 1},)")
    if manifest.id_columns:
        ids, expected = f.get("ids"), (shard.rows, manifest.id_columns)
        if ids is None or ids.shape != expected or ids.dtype != manifest.id_dtype:
            raise DataError(f"{path}: dataset 'ids' is {'absent' if ids is None else f'{ids.dtype}{list(ids.shape)}'}, "
                            f"expected {manifest.id_dtype}{list(expected)} (an id per categorical column)")
    expected_y = (shard.rows, *manifest.target_shape)
    if y.shape != expected_y or y.dtype != manifest.target_dtype:
        raise DataError(f"{path}: dataset 'y' is {y.dtype}{list(y.shape)}, expected "
                        f"{manifest.target_dtype}{list(expected_y)} (a {manifest.target} target)")
