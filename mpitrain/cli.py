"""`mpitrain train|eval|predict|export|etl|score|spark-train|report|info|tune|tune-worker|warm-up`: the command line, and
the one place user errors are caught.

Multi-rank commands run the same under `mpiexec -n N`, `srun`, or alone (1 rank). An
uncaught exception on any rank aborts the whole job (see `launch.install_abort_hook`);
a user error (bad config, bad data) prints one line on rank 0 and exits 2 on every rank. SIGUSR1, SIGTERM or SIGINT (Ctrl-C)
ends `train`, `eval` and `predict` on every rank with one line and exit 3, at any moment from `main`'s first line
(`mpitrain.training.preemption`: the handlers are held from there, before mpi4py is imported).
The commands are thin: `train` is `mpitrain.train`, and `eval`/`predict` build their run
with the same `mpitrain.training.run.setup_run`, as a Python script would (`mpitrain.api`).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

from mpitrain.base.errors import ConfigError, MpitrainError
from mpitrain.base.logs import setup_logging
from mpitrain.training.preemption import (
    Stopped,
    StopSignals,
    hold_stop_signals,
    release_stop_signals,
    signal_received,
    signals_blocked_while_mpi_starts,
)

log = logging.getLogger("mpitrain")
CHECKPOINT_HELP = ("a checkpoint file, best (early stopping's best) or latest (the newest); default: the best when the "
                   "run has one, else the newest")
OVERWRITE_HELP = ("replace an existing --out file (never one in a run's checkpoints/ or a dataset folder; the file is "
                  "written under a temporary name and renamed)")


def main(argv=None) -> int:
    hold_stop_signals()  # first: a signal from here on is one to stop at (mpitrain.training.preemption)
    _open_standard_streams()
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    parser = _parser(next((a for a in argv if not a.startswith("-")), None))
    args = parser.parse_args(argv)
    rank = 0
    try:
        if args.command in ("train", "eval", "predict", "tune-worker"):
            with signals_blocked_while_mpi_starts():  # MPI_Init installs a SIGUSR1 handler of its own
                from mpitrain.parallel.comm import Communicator
                from mpitrain.parallel.launch import install_abort_hook
                install_abort_hook()
                comm = Communicator()
            rank = comm.rank
            setup_logging(rank)
            args.run(args, comm)
            return _ended(args.command, comm)
        release_stop_signals()  # no agreement to stop at: a signal ends these commands as it would any program
        setup_logging(0)
        return args.run(args)
    except MpitrainError as e:
        stopped = isinstance(e, Stopped)  # not an error: a stop asked for
        if rank == 0:
            print(f"mpitrain {args.command}: {'' if stopped else 'error: '}{e}", file=sys.stderr)
        return Stopped.exit_status if stopped else 2


def _open_standard_streams() -> None:
    """Give a standard stream this process started without (`2>&-`, `>&-`, a daemon's closed descriptors) the null
    device. Python sets such a stream to None, and `train` ended with exit 1 and nothing written: its first write
    to stderr raised, with nowhere to say so. And the next file opened would take the free descriptor, 2, where C
    libraries (HDF5, MPI) write their errors."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            os.open(os.devnull, os.O_RDWR)  # takes fd: the lowest free descriptor, those below it open by now
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


def _ended(command: str, comm) -> int:
    """0, or 3 after a signal: `eval` and `predict` finish their work, then agree on one (a collective; `train`
    agreed after its report). A signal after that agreement, as the process ends, is this rank's alone: it says so
    itself."""
    if command != "train":
        signal_name = StopSignals(comm).agree_now()
        if signal_name:
            raise Stopped(f"stopped by {signal_name} after its work was done: its output above is complete")
    late = signal_received()
    if late:
        print(f"mpitrain {command}: stopped by {late} as rank {comm.rank} ended, after its work was done",
              file=sys.stderr)
        return Stopped.exit_status
    return 0


def _parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; the Spark commands' options (which import the ETL's and Spark's modules) only when
    `command` is one of them, or None (every command: `--help`). A rank of `train` imports no Spark job."""
    parser = argparse.ArgumentParser(prog="mpitrain", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model (run under mpiexec/srun for several ranks)")
    train.add_argument("config", help="YAML config file, e.g. configs/fashion_mlp.yaml")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a config key (value parsed as YAML); repeatable")
    train.add_argument("--resume", action="store_const", const="resume=auto", dest="resume",
                       help="continue from the run's newest checkpoint (the same as --set resume=auto)")
    train.set_defaults(run=_train)

    for name, run, help_text in (("eval", _eval, "evaluate a run's checkpoint (its best, else its newest) on a split"),
                                 ("predict", _predict, "write a run's predictions for a split to HDF5")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("run_dir", help="a run directory written by `mpitrain train`")
        sub.add_argument("--split", default="test")
        sub.add_argument("--checkpoint", help=CHECKPOINT_HELP)
        sub.add_argument("--batch-size", type=int, help="rows per scoring batch on each rank (default: "
                                                             "mpitrain.training.evaluation.EVAL_BATCH_SIZE)")
        sub.add_argument("--allow-other-dataset", action="store_true",
                         help="use a checkpoint trained on another dataset than data.path holds now (recorded in "
                              "the output)")
        if name == "predict":
            sub.add_argument("--out", help="output HDF5 file (default: RUN_DIR/predictions-SPLIT.h5, replaced on "
                                           "every call)")
            sub.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
            sub.add_argument("--records", metavar="PATH",
                             help="predict new raw records instead of a split: a table model's Parquet file or "
                                  "folder, encoded by the run's dataset's columns, each rank its row groups (a file "
                                  "vocabulary looked up by the ranks owning its parts); default --out "
                                  "RUN_DIR/predictions-records.h5, with each prediction's record index `row`")
            sub.add_argument("--embeddings", metavar="NODE",
                             help="write NODE's activations instead (a graph's node name, or a `layers:` model's "
                                  "index into model.layers): an autoencoder's code; default --out "
                                  "RUN_DIR/embeddings-SPLIT.h5 (docs/models.md)")
        else:
            sub.add_argument("--max-exact-rows", type=int, metavar="N",
                             help="score exactly, every prediction gathered on rank 0, up to N rows in all; AUC and "
                                  "average precision from histograms above (default: "
                                  "mpitrain.training.scores.MAX_EXACT_ROWS, 5x10^7)")
        sub.set_defaults(run=run)

    export = commands.add_parser("export", help="write a run's checkpoint as an ONNX model (one process)")
    export.add_argument("run_dir", help="a run directory written by `mpitrain train`")
    export.add_argument("--checkpoint", help=CHECKPOINT_HELP)
    export.add_argument("--out", required=True, help="the ONNX file to write, e.g. model.onnx")
    export.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    export.set_defaults(run=_export)

    etl = commands.add_parser("etl", help="run the Spark ETL job in local mode (same as spark-submit etl/prepare.py)")
    score = commands.add_parser("score", help="score a source with a model in Spark, local mode "
                                              "(same as spark-submit etl/score.py)")
    if command in (None, "etl", "score"):
        from mpitrain.etl.cli import add_arguments, add_score_arguments, run, run_score
        add_arguments(etl)
        etl.set_defaults(run=_spark_job(run))
        add_score_arguments(score)
        score.set_defaults(run=_spark_job(run_score))

    spark_train = commands.add_parser("spark-train", help="train on N ranks inside Spark, one barrier stage (same as "
                                                          "spark-submit etl/train.py)")
    if command in (None, "spark-train"):
        from mpitrain.spark import cli as spark_cli
        spark_cli.add_arguments(spark_train, "local[RANKS]")
        spark_train.set_defaults(run=_spark_job(lambda args: spark_cli.run(
            argparse.Namespace(**{**vars(args), "master": args.master or f"local[{args.ranks}]"}))))

    report = commands.add_parser("report", help="draw report.png and report.html from one or more run directories")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, overlaid in one report")
    report.add_argument("--out", help="output folder (default: RUN_DIR for one run, the current folder for several; "
                                      "the report there is replaced on every call)")
    report.add_argument("--overwrite", action="store_true", help="replace report.png and report.html in an --out "
                                                                 "folder that holds them")
    report.add_argument("--tensorboard", action="store_true", help="also write each run's TensorBoard event files "
                                                                    "again from its metrics.jsonl (the tensorboard package)")
    report.set_defaults(run=_report)

    tune = commands.add_parser("tune", help="search hyperparameters: run a study's trials as MPI jobs (docs/tuning.md)")
    tune.add_argument("study", help="a study file (STUDY.yaml), or its study folder")
    tune.add_argument("--workers", type=int, default=1, help="worker jobs at once on this machine (default 1)")
    tune.add_argument("--ranks", type=int, default=1, help="MPI ranks of each worker (default 1)")
    tune.add_argument("--status", action="store_true", help="print the study's trials and write its results; "
                                                            "run nothing")
    tune.set_defaults(run=_tune)
    worker = commands.add_parser("tune-worker", help="take a study's trials until its budget is spent (run under "
                                                     "mpiexec/srun)")
    worker.add_argument("study", help="a study folder, or its study file")
    worker.add_argument("--no-plots", action="store_true",
                        help="end with trials.csv and best.yaml only, not the study's plots and report (what "
                             "`mpitrain tune` asks of its workers: it draws them once, after they all ended)")
    worker.set_defaults(run=_tune_worker)

    warm = commands.add_parser("warm-up", help="compile the CPU kernels training runs into numba's cache, once "
                                               "after installing (`make setup` runs it)")
    warm.add_argument("--part", type=_part, default=(1, 1), metavar="I/N",
                      help="run part I of N of the cases, for N processes at once (default 1/1: all)")
    warm.set_defaults(run=_warm_up)

    info = commands.add_parser("info", help="summarize a dataset and verify its shard checksums")
    info.add_argument("dataset", help="dataset folder (holds manifest.json)")
    info.add_argument("--no-verify", action="store_true", help="skip the sha256 checks")
    info.set_defaults(run=_info)
    return parser


def _train(args, comm) -> int:
    from mpitrain.rundir.directory import load_run_config
    from mpitrain.training.loop import train
    train(load_run_config(args.config, args.set + ([args.resume] if args.resume else [])), comm)
    return 0


def _eval(args, comm) -> int:
    from mpitrain.training.trained import evaluate_run
    result = evaluate_run(args.run_dir, comm, args.split, args.checkpoint, args.batch_size, args.allow_other_dataset,
                          args.max_exact_rows)
    if comm.is_root:
        from mpitrain.training.metrics import figure
        print(f"{args.split}: accuracy {figure(result['accuracy'])}  loss {result['loss']:.4f}  "
              f"rows {result['rows']}  ({result['checkpoint']})")
        if "confusion" not in result:  # binary, multilabel, regression: the kind's single figures
            print("  ".join(f"{key} {value:.4f}" for key, value in result.items()
                            if isinstance(value, float) and key not in ("accuracy", "loss", "auc_error_bound")))
            if result.get("auc_mode") == "histogram":
                bound = result["auc_error_bound"]  # binary: one number; multilabel: one per label
                bounds = [b for b in (bound if isinstance(bound, list) else [bound]) if b is not None] or [0.0]
                print(f"AUC and average precision from histograms of {result['auc_bins']} bins: AUC within "
                      f"{max(bounds):.1e} of the exact")
            print(f"wrote {result['json']} and {result['picture']}")
            return 0
        print(f"{'class':>12}  precision  recall")
        for name, p, r in zip(result["class_names"], result["precision"], result["recall"]):
            print(f"{name:>12}  {p:9.4f}  {r:6.4f}")
        print(f"wrote {result['json']} and {result['picture']}")
    return 0


def _predict(args, comm) -> int:
    from mpitrain.training.activations import predict_activations
    from mpitrain.training.trained import predict_records, predict_run
    if args.records is not None:
        with comm.agreed_errors():
            if args.embeddings is not None or args.split != "test" or args.allow_other_dataset:
                raise ConfigError("--records: scores new records by the run's own dataset's columns; expected no "
                                  "--embeddings, --split or --allow-other-dataset beside it")
        path, rows, tally = predict_records(args.run_dir, comm, args.records, args.out, args.checkpoint,
                                            args.batch_size, args.overwrite)
        if comm.is_root:
            left_out = f"; {tally.bad} left out, the first {tally.first_bad}" if tally.bad else ""
            print(f"wrote {path}: {rows} rows of {tally.records} records of {args.records}{left_out}")
        return 0
    if args.embeddings is not None:
        path, rows = predict_activations(args.run_dir, comm, args.embeddings, args.split, args.out, args.checkpoint,
                                         args.batch_size, args.allow_other_dataset, args.overwrite)
    else:
        path, rows = predict_run(args.run_dir, comm, args.split, args.out, args.checkpoint, args.batch_size,
                                 args.allow_other_dataset, args.overwrite)
    if comm.is_root:
        print(f"wrote {path}: {rows} rows of split {args.split!r}")
    return 0


def _export(args) -> int:
    from mpitrain.rundir.directory import check_output
    from mpitrain.rundir.export import describe_tensor, export_run, metadata, write_model
    check_output(args.out, args.overwrite)  # before the work, not after it
    proto = export_run(args.run_dir, args.checkpoint)
    write_model(proto, args.out, args.overwrite)
    print(f"wrote {args.out}: {len(proto.graph.node)} ONNX nodes (opset {proto.opset_import[0].version}), "
          f"rows {describe_tensor(proto.graph.input[0])} -> {proto.graph.output[0].name} "
          f"{describe_tensor(proto.graph.output[0])}; from {metadata(proto)['checkpoint']}")
    return 0


def _report(args) -> int:
    from mpitrain.rundir.report import write_report
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else ".")
    print("wrote {} and {}".format(*write_report(args.run_dirs, out, args.overwrite or not args.out)))
    if args.tensorboard:
        from mpitrain.rundir.tensorboard import write_events
        for run_dir in args.run_dirs:
            print(f"wrote TensorBoard events in {write_events(run_dir)} (tensorboard --logdir {run_dir})")
    return 0


def _part(text: str) -> tuple[int, int]:
    """`--part I/N` as (I, N), 1 <= I <= N."""
    part, _, parts = text.partition("/")
    if not (part.isdigit() and parts.isdigit() and 1 <= int(part) <= int(parts)):
        raise argparse.ArgumentTypeError(f"{text!r} is not I/N with 1 <= I <= N (e.g. 1/2)")
    return int(part), int(parts)


def _warm_up(args) -> int:
    from mpitrain.training.kernel_cache import warm_up
    part, parts = args.part
    seconds = warm_up(part, parts)
    print(f"warm-up {part}/{parts}: numba's cache holds the kernels of its cases ({seconds:.1f} s)")
    return 0


def _tune(args) -> int:
    from mpitrain.tune.launcher import run_study, show_status
    return show_status(args.study) if args.status else run_study(args.study, args.workers, args.ranks)


def _tune_worker(args, comm) -> int:
    from mpitrain.tune.worker import run_worker
    ran = run_worker(args.study, comm, plots=not args.no_plots)
    if comm.is_root:
        print(f"{args.study}: this worker ran {ran} trials; the study's budget is spent")
    return 0


def _spark_job(job):
    """`job(args)` with Spark's Python workers and driver running this Python unless the user chose."""
    def run(args) -> int:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        return job(args)
    return run


def _target(manifest) -> str:
    """The target in a few words: `10 classes`, `target binary (clicked)`, `target multilabel (3 labels: a, b, c)`,
    a regression target's train statistics (`target regression (price); train split's price mean 12 std 3`)."""
    if manifest.target == "class":
        return f"{manifest.num_classes} classes" + (f" ({', '.join(manifest.class_names[:10])}"
                                                    f"{' ...' if len(manifest.class_names) > 10 else ''})"
                                                    if manifest.class_names else "")
    names = manifest.target_names
    statistics = ", ".join(f"{name} mean {mean:.6g} std {std:.6g}"
                           for name, mean, std in zip(names, manifest.target_mean, manifest.target_std))
    return f"target {manifest.target} (" + (f"{len(names)} {'labels' if manifest.target == 'multilabel' else 'values'}"
                                            f": " if len(names) > 1 else "") + f"{', '.join(names)})" \
        + (f"; train split's {statistics}" if statistics else "")


def _columns(manifest) -> list[str]:
    """A table's column groups, a line each: every column and how it was encoded; each sequence or bag column, a
    line."""
    def numeric(c):
        notes = [note for key, note in (("mean", "standardized"), ("impute", "imputed"),
                                        ("missing_of", f"missing indicator of {c.get('missing_of')}")) if key in c]
        return c["name"] + (f" ({', '.join(notes)})" if notes else "")

    def categorical(c):
        how = f"{c['hash_buckets']} hash buckets" if "hash_buckets" in c else \
            f"vocabulary of {c['ids'] - 2} in {c['vocabulary_parts']} Parquet files {c['vocabulary_path']}/, min count " \
            f"{c.get('min_count', 1)}" if "vocabulary_path" in c else \
            f"vocabulary of {len(c['vocabulary'])}, min count {c.get('min_count', 1)}"
        return f"{c['name']} ({c['ids']} ids: {how})"

    def sequence(c):
        if c.get("bag"):
            return f"bag {categorical(c)}: {c['shortest']}..{c['longest']} values (at most {c['max_length']}), " \
                   f"{sum(c.get('steps', {}).values())} values stored"
        return f"sequence {c['name']}: {c['features']} feature(s) per step, {c.get('shortest', 1)}..{c['longest']} " \
               f"steps (at most {c['max_length']}){', ' + str(c['ids']) + ' token ids' if 'ids' in c else ''}, " \
               f"{sum(c.get('steps', {}).values())} steps stored"

    describe = {"numeric": numeric, "categorical": categorical}
    sequences = [sequence(c) for c in manifest.sequences]
    if manifest.step_target:
        sequences.append(f"a class per step: label column {manifest.step_target!r}, stored ragged")
    return [f"columns {group} ({len(columns)}): {', '.join(map(describe[group], columns))}"
            for group, columns in manifest.columns.items()] + sequences


def _info(args) -> int:
    from mpitrain.data.shards import check_shard, read_manifest
    manifest = read_manifest(args.dataset)
    print(f"{args.dataset}: schema {manifest.schema_version}, features {manifest.feature_dtype}"
          f"{list(manifest.feature_shape)} (scale {manifest.scale:.6g}, offset {manifest.offset:g}, "
          f"mean {manifest.mean:.6g}, std {manifest.std:.6g})"
          f"{f', ids {manifest.id_dtype}[{manifest.id_columns}]' if manifest.id_columns else ''}, {_target(manifest)}")
    for line in _columns(manifest):
        print(line)
    if manifest.source:
        transforms = ", ".join(t["name"] + "(" + ", ".join(f"{k}={v}" for k, v in t.items()
                                                           if k != "name" and not isinstance(v, list)) + ")"
                               for t in manifest.transforms)
        print(f"source {manifest.source}, seed {manifest.seed}, transforms {transforms or 'none'}"
              + (f", {manifest.bad_records} bad records dropped" if manifest.bad_records else ""))
    print(f"shards: compression {manifest.compression}, {manifest.chunk_rows} rows per chunk, "
          f"checksums: {manifest.checksums + ' per chunk, ' if manifest.checksums else ''}sha256 per file")
    counted = {"class": "label counts", "binary": "positives", "multilabel": "positives per label"}.get(manifest.target)
    for split, shards in manifest.splits.items():
        print(f"  {split}: {manifest.rows(split)} rows in {len(shards)} shards"
              + (f"; {counted} {manifest.label_counts.get(split)}" if counted else ""))
        for shard in shards:
            check_shard(args.dataset, manifest, shard, verify_checksum=not args.no_verify)
    print("all shards present and well-formed" + ("" if args.no_verify else ", checksums verified"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
