"""The ETL and scoring command lines: `mpitrain etl|score ...` and `spark-submit etl/prepare.py|score.py ...`
share them, and the two jobs share their source, output and bad-record options."""
from __future__ import annotations

import argparse
import os
import sys

from mpitrain.base.errors import MpitrainError
from mpitrain.data.shards import COMPRESSIONS, TARGETS
from mpitrain.etl.job import plan_etl, write_dataset
from mpitrain.etl.sequence_columns import DEFAULT_MAX_LENGTH
from mpitrain.etl.shuffle import ORDERS
from mpitrain.etl.sources import KNOWN_SOURCES, SourceOptions
from mpitrain.etl.tables import MAX_VOCABULARY, NUMERIC_MISSING, TableOptions
from mpitrain.etl.transforms import BINARIZE_MODES, TransformOptions
from mpitrain.spark.session import spark_session


def _sizes(separator: str):
    """An argparse type for sizes like 1,28,28 or 28x28."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            sizes = tuple(int(part) for part in text.split(separator))
        except ValueError:
            sizes = ()
        if not sizes or min(sizes) < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers separated by {separator!r}")
        return sizes
    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _hash_buckets(text: str) -> tuple[tuple[str, int], ...]:
    """--hash-buckets: N (every --categorical column) and/or COL:N (that column), comma-separated."""
    buckets = []
    for part in text.split(","):
        column, _, number = part.strip().rpartition(":")
        try:
            buckets.append((column.strip(), int(number)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected N (every categorical column) or COL:N, "
                                             "comma-separated") from None
    return tuple(buckets)


def _add_io_arguments(parser: argparse.ArgumentParser, out_help: str) -> None:
    """What the ETL and scoring share: a source, an output that appears only when complete, Spark's master."""
    parser.add_argument("--source", required=True, help="; ".join(KNOWN_SOURCES))
    parser.add_argument("--out", required=True, help=out_help)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output at --out")
    parser.add_argument("--master", help="Spark master (default: spark-submit's --master or "
                                         "spark-defaults.conf, else local[*])")
    parser.add_argument("--max-bad-fraction", type=float, default=0.0,
                        help="fail when more than this fraction of the records is bad; bad records are "
                             "dropped, counted and a sample printed (default 0: any bad record fails)")


def _add_column_arguments(parser: argparse.ArgumentParser, scoring: bool):
    """The csv, parquet and images options; scoring takes dtype and classes from the model, and shapes by default."""
    columns = parser.add_argument_group("csv, parquet and images sources")
    columns.add_argument("--label", default="", help="label columns, comma-separated: names or 0-based indices "
                                                     "(default: csv the first column, parquet `label`)")
    columns.add_argument("--no-header", dest="header", action="store_false",
                         help="csv: the first line is data, not column names")
    columns.add_argument("--features", type=_names, default=(),
                         help="csv/parquet: feature columns, comma-separated (default: all but the labels"
                              + (" and the keys)" if scoring else ")"))
    default = "the model's" if scoring else "flat"
    columns.add_argument("--feature-shape", type=_sizes(","), default=(), metavar="D1,D2,...",
                         help=f"csv/parquet: shape of one row's features, e.g. 1,28,28 (default: {default})")
    columns.add_argument("--image-size", type=_sizes("x"), default=(), metavar="HEIGHTxWIDTH",
                         help="images: every image is resized to this, e.g. 28x28"
                              + (" (default: the model's)" if scoring else ""))
    columns.add_argument("--color", default="" if scoring else "gray", choices=("gray", "rgb"),
                         help="images: channels (default " + ("the model's" if scoring else "gray") + ")")
    return columns


def source_options(args: argparse.Namespace, **more) -> SourceOptions:
    """The SourceOptions of parsed arguments; `more` are the fields only one command has."""
    return SourceOptions(label=args.label, header=args.header, features=args.features,
                         feature_shape=args.feature_shape, image_size=args.image_size, color=args.color, **more)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ETL options to `parser`."""
    _add_io_arguments(parser, "dataset folder, or an object store's URL (s3://bucket/prefix; endpoint and "
                              "credentials from the AWS_* variables), to write; it appears only when complete")
    parser.add_argument("--shards", type=int, required=True, help="shards per split (sizes differ by at most 1)")
    parser.add_argument("--order", default="shuffled", choices=ORDERS,
                        help="the rows' order in the shards: shuffled by a seeded hash of each row (the default), "
                             "or by label (a dataset stored by class, to test a trainer's shuffle)")
    parser.add_argument("--compression", default="none", choices=COMPRESSIONS,
                        help="the shards' HDF5 codec: gzip (any HDF5 reader), lz4 or zstd (need hdf5plugin) "
                             "(default none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row shuffle, split carving and "
                                                            "stochastic binarize (default 0)")
    splits = parser.add_argument_group("splits")
    splits.add_argument("--test", default="", metavar="PATH",
                        help="csv/parquet/images: the test split at PATH (same layout as --source)")
    splits.add_argument("--test-fraction", type=float, default=0.2,
                        help="test split carved (stratified) from a source without one (default 0.2)")
    splits.add_argument("--validation-fraction", type=float, default=0.0,
                        help="a `validation` split carved (stratified) from the train rows (default 0: none)")
    columns = _add_column_arguments(parser, scoring=False)
    columns.add_argument("--feature-dtype", default="float32", choices=("float32", "uint8"),
                         help="csv/parquet: stored dtype; uint8 needs integers 0..255 (default float32)")
    columns.add_argument("--num-classes", type=int, default=0,
                         help="csv/parquet: number of classes (default: the largest label + 1)")
    columns.add_argument("--target", default="", choices=TARGETS,
                         help="csv/parquet: what the label columns hold (default: inferred from the first 100 "
                              "records: one column of integers or text: class; of other numbers: regression; "
                              "several columns of 0/1: multilabel, else regression; binary only when stated)")
    tables = parser.add_argument_group("tables: categorical columns and missing numbers (the manifest's columns)")
    tables.add_argument("--categorical", type=_names, default=(), metavar="COL,...",
                        help="csv/parquet: columns of strings or integers that become ids (id 0: missing, 1: out of "
                             "vocabulary), through a vocabulary of the train split or --hash-buckets")
    tables.add_argument("--hash-buckets", type=_hash_buckets, default=(), metavar="N|COL:N,...",
                        help="hash categorical values into N buckets (ids 1..N) instead of a vocabulary: N for "
                             "every --categorical and --bag column, COL:N for one")
    tables.add_argument("--min-count", type=int, default=1,
                        help="a value seen fewer times in the train split is out of vocabulary (default 1)")
    tables.add_argument("--max-vocabulary", type=int, default=MAX_VOCABULARY,
                        help="fail, naming the column, when a vocabulary would be larger: hash such a column "
                             f"(default {MAX_VOCABULARY}), or keep it in files (--vocabulary-files)")
    tables.add_argument("--vocabulary-files", action="store_true",
                        help="write a vocabulary larger than --max-vocabulary as Parquet files beside the manifest "
                             "(vocabularies/COL/part-*.parquet), by the Spark tasks that count it, instead of failing")
    tables.add_argument("--numeric-missing", default="bad", choices=NUMERIC_MISSING,
                        help="a missing numeric value: a bad record (the default), or imputed by the train mean "
                             "with a COL_missing indicator column")
    sequences = parser.add_argument_group("sequences (docs/sequences.md)")
    sequences.add_argument("--sequence", dest="sequences", action="append", default=[], metavar="COL",
                           help="parquet: a column holding a list of numbers (or of equal-length lists of numbers) "
                                "per record, stored ragged; give it once per column (then --features are the fixed "
                                "numeric columns beside it, default none)")
    sequences.add_argument("--bag", dest="bags", action="append", default=[], metavar="COL",
                           help="csv/parquet: a column holding a list of categorical values per record (parquet: a "
                                "list of strings or integers; csv: values separated by --bag-delimiter in the "
                                "cell), stored ragged as ids through a vocabulary of the train split, or "
                                "--hash-buckets; empty lists allowed; give it once per column (docs/sequences.md)")
    sequences.add_argument("--bag-delimiter", default="|", metavar="CHAR",
                           help="csv: what separates a --bag cell's values (default |)")
    sequences.add_argument("--max-length", type=int, default=DEFAULT_MAX_LENGTH,
                           help="fail, naming the record, on a sequence of more steps or a bag of more values "
                                f"(default {DEFAULT_MAX_LENGTH})")
    transforms = parser.add_argument_group("transforms (recorded in the manifest)")
    transforms.add_argument("--scale", action="store_true",
                            help="map features to [0, 1] by the train split's min and max")
    transforms.add_argument("--standardize", action="store_true",
                            help="per feature (a table: per numeric column; a --sequence column: per channel over "
                                 "its steps, unless it holds token ids): subtract the train mean, divide by the "
                                 "train std (float32)")
    transforms.add_argument("--binarize", default="", choices=BINARIZE_MODES,
                            help="features to 0/1 (uint8): value >= --threshold, or 1 with probability value")
    transforms.add_argument("--threshold", type=float, default=0.5, help="--binarize threshold (default 0.5)")
    transforms.add_argument("--one-hot", action="store_true", help="shards also get y_onehot (rows, classes) uint8")


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the scoring options to `parser`."""
    parser.add_argument("--model", required=True, help="an ONNX file (mpitrain export) or a run directory "
                                                       "(its newest checkpoint, exported in memory)")
    _add_io_arguments(parser, "predictions folder (Parquet) to write; it appears only when complete")
    parser.add_argument("--split", default="", help="the source split to score (default: test if the source "
                                                    "has one, else train)")
    columns = _add_column_arguments(parser, scoring=True)
    columns.add_argument("--no-label", dest="labeled", action="store_false",
                         help="csv/parquet/images: the records have no label column (no accuracy)")
    columns.add_argument("--keys", type=lambda text: tuple(text.split(",")), default=(),
                         help="parquet: columns that identify a record, copied to the output (default: a row "
                              "number `row`)")


def plan_from_args(args: argparse.Namespace):
    """The EtlPlan of parsed arguments (checked before Spark starts)."""
    source = source_options(args, test=args.test, feature_dtype=args.feature_dtype, num_classes=args.num_classes,
                            target=args.target, categorical=args.categorical, numeric_missing=args.numeric_missing,
                            sequences=tuple(args.sequences), max_length=args.max_length, bags=tuple(args.bags),
                            bag_delimiter=args.bag_delimiter)
    tables = TableOptions(args.hash_buckets, args.min_count, args.max_vocabulary, args.vocabulary_files)
    transforms = TransformOptions(scale=args.scale, standardize=args.standardize, binarize=args.binarize,
                                  threshold=args.threshold, one_hot=args.one_hot)
    return plan_etl(args.source, args.out, args.shards, args.seed, args.overwrite, test_fraction=args.test_fraction,
                    validation_fraction=args.validation_fraction, max_bad_fraction=args.max_bad_fraction,
                    compression=args.compression, order=args.order, transforms=transforms, source_options=source,
                    tables=tables)


def run(args: argparse.Namespace) -> int:
    """Validate the request, run the Spark job and print a summary; a DataError propagates."""
    plan = plan_from_args(args)  # checked before Spark starts (seconds), so a wrong --out or --shards fails at once
    with spark_session(args.master, "mpitrain-etl") as spark:
        master = spark.sparkContext.master
        manifest = write_dataset(spark, plan)
    rows = ", ".join(f"{split} {manifest.rows(split)} rows" for split in manifest.splits)
    rows += f" ({manifest.bad_records} bad records dropped)" if manifest.bad_records else ""
    print(f"wrote {plan.out}: {rows}; {plan.shards} shards per split (Spark master {master})")
    return 0


def run_score(args: argparse.Namespace) -> int:
    """Validate the request, score with Spark, print the counts (and, given labels, the metrics)."""
    from mpitrain.etl.scoring import METRICS_NAME, metric_lines, plan_scoring, score

    plan = plan_scoring(args.model, args.source, args.out, args.split, args.overwrite, args.max_bad_fraction,
                        source_options(args, labeled=args.labeled, keys=args.keys))
    with spark_session(args.master, "mpitrain-score") as spark:
        master = spark.sparkContext.master
        metrics = score(spark, plan)
    bad = f" ({metrics['bad_records']} bad records dropped)" if metrics["bad_records"] else ""
    print(f"wrote {plan.out}: {metrics['rows']} rows of {plan.source.spec} split {plan.split!r} scored{bad}; "
          f"metrics in {os.path.join(plan.out, METRICS_NAME)} (Spark master {master})")
    for line in metric_lines(metrics):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    """The `spark-submit etl/prepare.py` entry: parse `argv`, run, print an input error as one line."""
    return _main(argv, "etl/prepare.py", "Spark ETL: a source to HDF5 shards", add_arguments, run)


def main_score(argv: list[str] | None = None) -> int:
    """The `spark-submit etl/score.py` entry: parse `argv`, score, print an input error as one line."""
    return _main(argv, "etl/score.py", "Spark batch scoring: a model's predictions for a source",
                 add_score_arguments, run_score)


def _main(argv, prog: str, description: str, add, job) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add(parser)
    try:
        return job(parser.parse_args(argv))
    except MpitrainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2  # as every mpitrain command, and argparse's own usage errors
