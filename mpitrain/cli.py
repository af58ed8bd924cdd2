"""`mpitrain train|eval|predict|export|etl|score|report|info`: the command line, and the one place user errors
are caught.

Multi-rank commands run the same under `mpiexec -n N`, `srun`, or alone (1 rank). An
uncaught exception on any rank aborts the whole job (see `launch.install_abort_hook`);
a user error (bad config, bad data) prints one line on rank 0 and exits 2 on every rank; a
training stopped by SIGUSR1/SIGTERM, its checkpoint written, exits 3.
The commands are thin: `train` is `mpitrain.train`, and `eval`/`predict` build their run
with the same `mpitrain.run.setup_run`, as a Python script would (`mpitrain.api`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np

from mpitrain.errors import MpitrainError
from mpitrain.files import os_errors, write_file

log = logging.getLogger("mpitrain")


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    rank = 0
    try:
        if args.command in ("train", "eval", "predict"):
            from mpitrain.comm import Communicator
            from mpitrain.launch import install_abort_hook
            install_abort_hook()
            comm = Communicator()
            rank = comm.rank
            _setup_logging(rank)
            return args.run(args, comm)
        _setup_logging(0)
        return args.run(args)
    except MpitrainError as e:
        stopped = getattr(e, "exit_status", None)  # preemption.Stopped: not an error, a checkpoint to resume
        if rank == 0:
            print(f"mpitrain {args.command}: {'' if stopped else 'error: '}{e}", file=sys.stderr)
        return stopped or 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpitrain", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train a model (run under mpiexec/srun for several ranks)")
    train.add_argument("config", help="YAML config file, e.g. configs/fashion_mlp.yaml")
    train.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override a config key (value parsed as YAML); repeatable")
    train.add_argument("--resume", action="store_const", const="resume=auto", dest="resume",
                       help="continue from the run's newest checkpoint (the same as --set resume=auto)")
    train.set_defaults(run=_train)

    for name, run, help_text in (("eval", _eval, "evaluate a run's newest checkpoint on a split"),
                                 ("predict", _predict, "write a run's predictions for a split to HDF5")):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("run_dir", help="a run directory written by `mpitrain train`")
        sub.add_argument("--split", default="test")
        sub.add_argument("--checkpoint", help="checkpoint file (default: the run's newest)")
        sub.add_argument("--batch-size", type=int, default=256)
        sub.add_argument("--allow-other-dataset", action="store_true",
                         help="use a checkpoint trained on another dataset than data.path holds now (recorded in "
                              "the output)")
        if name == "predict":
            sub.add_argument("--out", help="output HDF5 file (default: RUN_DIR/predictions-SPLIT.h5)")
        sub.set_defaults(run=run)

    export = commands.add_parser("export", help="write a run's checkpoint as an ONNX model (one process)")
    export.add_argument("run_dir", help="a run directory written by `mpitrain train`")
    export.add_argument("--checkpoint", help="checkpoint file (default: the run's newest)")
    export.add_argument("--out", required=True, help="the ONNX file to write, e.g. model.onnx")
    export.set_defaults(run=_export)

    from mpitrain.etl.cli import add_arguments, add_score_arguments, run, run_score
    etl = commands.add_parser("etl", help="run the Spark ETL job in local mode (same as spark-submit etl/prepare.py)")
    add_arguments(etl)
    etl.set_defaults(run=_spark_job(run))
    score = commands.add_parser("score", help="score a source with a model in Spark, local mode "
                                              "(same as spark-submit etl/score.py)")
    add_score_arguments(score)
    score.set_defaults(run=_spark_job(run_score))

    report = commands.add_parser("report", help="draw report.png and report.html from one or more run directories")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, overlaid in one report")
    report.add_argument("--out", help="output folder (default: RUN_DIR for one run, the current folder for several)")
    report.set_defaults(run=_report)

    info = commands.add_parser("info", help="summarize a dataset and verify its shard checksums")
    info.add_argument("dataset", help="dataset folder (holds manifest.json)")
    info.add_argument("--no-verify", action="store_true", help="skip the sha256 checks")
    info.set_defaults(run=_info)
    return parser


def _setup_logging(rank: int) -> None:
    from mpitrain.api import setup_logging
    setup_logging(rank)


def _train(args, comm) -> int:
    from mpitrain.config import load_config
    from mpitrain.training import train
    train(load_config(args.config, args.set + ([args.resume] if args.resume else [])), comm)
    return 0


def _eval(args, comm) -> int:
    from mpitrain.evaluation import evaluate
    from mpitrain.report import class_names, write_confusion_png
    trained = _load_trained(args, comm)
    result = evaluate(trained.run.model, trained.rows, trained.to_input, args.batch_size, trained.run.comm,
                      trained.manifest.num_classes, trained.run.backend).to_dict()
    with comm.agreed_errors():
        if comm.is_root:
            out = os.path.join(args.run_dir, f"eval-{args.split}.json")
            write_file(out, lambda f: json.dump({**trained.provenance(args), **result}, f, indent=2))
            names = trained.manifest.class_names or class_names(trained.manifest.source, trained.manifest.num_classes)
            picture = os.path.join(args.run_dir, f"confusion-{args.split}.png")
            with os_errors(picture, "drawing the confusion matrix"):
                write_confusion_png(np.array(result["confusion"]), names, picture,
                                    f"{os.path.basename(os.path.abspath(args.run_dir))}, {args.split}: "
                                    f"accuracy {result['accuracy']:.4f}")
            print(f"{args.split}: accuracy {result['accuracy']:.4f}  loss {result['loss']:.4f}  "
                  f"rows {result['rows']}  ({trained.checkpoint.path})")
            print(f"{'class':>12}  precision  recall")
            for name, p, r in zip(names, result["precision"], result["recall"]):
                print(f"{name:>12}  {p:9.4f}  {r:6.4f}")
            print(f"wrote {out} and {picture}")
    return 0


def _predict(args, comm) -> int:
    import h5py
    from mpitrain.evaluation import predict
    trained = _load_trained(args, comm)
    classes, probabilities = predict(trained.run.model, trained.rows, trained.to_input, args.batch_size,
                                     trained.run.backend)
    parts = comm.gather_obj((classes, probabilities, trained.rows.y))
    with comm.agreed_errors():
        if comm.is_root:
            def write(f):
                with h5py.File(f, "w") as h5:
                    h5.create_dataset("predicted", data=np.concatenate([p[0] for p in parts]))
                    h5.create_dataset("probabilities", data=np.concatenate([p[1] for p in parts]))
                    h5.create_dataset("label", data=np.concatenate([p[2] for p in parts]))
                    h5.attrs.update(trained.provenance(args))
            write_file(_predictions_path(args), write, binary=True)
            print(f"wrote {_predictions_path(args)}: {sum(len(p[0]) for p in parts)} rows of split {args.split!r}")
    return 0


def _predictions_path(args) -> str:
    return args.out or os.path.join(args.run_dir, f"predictions-{args.split}.h5")


class _Trained:
    """A run set up as training set it up, a checkpoint's parameters in its model, and this rank's rows of a split."""

    def __init__(self, run, rows, checkpoint):
        self.run, self.rows, self.checkpoint = run, rows, checkpoint
        self.manifest = run.reader.manifest
        self.to_input = run.batches(rows, 1, training=False).to_model_input

    def provenance(self, args) -> dict:
        """What the scores were computed from: the checkpoint, the split, the dataset, and whether the
        checkpoint was trained on another dataset than the one scored (allowed by --allow-other-dataset)."""
        return {"checkpoint": self.checkpoint.path, "split": args.split, "dataset": self.run.reader.path,
                "manifest_sha256": self.run.reader.manifest_sha256,
                "trained_on_manifest_sha256": self.checkpoint.manifest_sha256,
                "other_dataset": self.checkpoint.manifest_sha256 != self.run.reader.manifest_sha256}


def _load_trained(args, comm) -> _Trained:
    """The run of `args.run_dir` (its config.yaml), its checkpoint, and this rank's rows of `args.split` (a collective)."""
    from mpitrain.config import load_config
    from mpitrain.run import setup_run

    with comm.agreed_errors():
        if args.batch_size < 1:
            raise MpitrainError(f"--batch-size is {args.batch_size}, expected an integer >= 1")
        if args.command == "predict" and os.path.isdir(_predictions_path(args)):
            raise MpitrainError(f"--out {_predictions_path(args)}: is a folder; expected an HDF5 file path")
        if not os.path.isdir(args.run_dir):
            raise MpitrainError(f"{args.run_dir}: no such run directory; expected a folder written by `mpitrain train`")
        # the run's own folder, wherever it was trained; eval and predict score every row of the split
        config = load_config(os.path.join(args.run_dir, "config.yaml"),
                             [f"run_dir={os.path.abspath(args.run_dir)}", "data.max_rows=0"])
    run = setup_run(config, comm)
    with run.comm.agreed_errors():
        checkpoint = run.checkpointer.restore(run.model, args.checkpoint, other_dataset=args.allow_other_dataset)
        rows = run.reader.rows(args.split, training=False)
    return _Trained(run, rows, checkpoint)


def _export(args) -> int:
    from mpitrain.export import describe_tensor, export_run, metadata, write_model
    proto = export_run(args.run_dir, args.checkpoint)
    write_model(proto, args.out)
    print(f"wrote {args.out}: {len(proto.graph.node)} ONNX nodes (opset {proto.opset_import[0].version}), "
          f"rows {describe_tensor(proto.graph.input[0])} -> probabilities "
          f"{describe_tensor(proto.graph.output[0])}; from {metadata(proto)['checkpoint']}")
    return 0


def _report(args) -> int:
    from mpitrain.report import write_report
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else ".")
    print("wrote {} and {}".format(*write_report(args.run_dirs, out)))
    return 0


def _spark_job(job):
    """`job(args)` with Spark's Python workers and driver running this Python unless the user chose."""
    def run(args) -> int:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        return job(args)
    return run


def _info(args) -> int:
    from mpitrain.shard_format import check_shard, read_manifest
    manifest = read_manifest(args.dataset)
    print(f"{args.dataset}: schema {manifest.schema_version}, features {manifest.feature_dtype}"
          f"{list(manifest.feature_shape)} (scale {manifest.scale:.6g}, offset {manifest.offset:g}, "
          f"mean {manifest.mean:.6g}, std {manifest.std:.6g}), {manifest.num_classes} classes")
    if manifest.source:
        transforms = ", ".join(t["name"] + "(" + ", ".join(f"{k}={v}" for k, v in t.items()
                                                           if k != "name" and not isinstance(v, list)) + ")"
                               for t in manifest.transforms)
        print(f"source {manifest.source}, seed {manifest.seed}, transforms {transforms or 'none'}"
              + (f", {manifest.bad_records} bad records dropped" if manifest.bad_records else ""))
    for split, shards in manifest.splits.items():
        print(f"  {split}: {manifest.rows(split)} rows in {len(shards)} shards; "
              f"label counts {manifest.label_counts.get(split)}")
        for shard in shards:
            check_shard(args.dataset, manifest, shard, verify_checksum=not args.no_verify)
    print("all shards present and well-formed" + ("" if args.no_verify else ", checksums verified"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
