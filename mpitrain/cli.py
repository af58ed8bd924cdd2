"""`mpitrain train|eval|predict|etl|report|info`: the command line, and the one place user errors are caught.

Multi-rank commands run the same under `mpiexec -n N`, `srun`, or alone (1 rank). An
uncaught exception on any rank aborts the whole job (see `comm.install_abort_hook`);
a user error (bad config, bad data) prints one line on rank 0 and exits 2 on every rank.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np

from mpitrain.errors import DataError, MpitrainError

log = logging.getLogger("mpitrain")


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    rank = 0
    try:
        if args.command in ("train", "eval", "predict"):
            from mpitrain.comm import Communicator, install_abort_hook
            install_abort_hook()
            comm = Communicator()
            rank = comm.rank
            _setup_logging(rank)
            return args.run(args, comm)
        _setup_logging(0)
        return args.run(args)
    except MpitrainError as e:
        if rank == 0:
            print(f"mpitrain {args.command}: error: {e}", file=sys.stderr)
        return 2


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
        if name == "predict":
            sub.add_argument("--out", help="output HDF5 file (default: RUN_DIR/predictions-SPLIT.h5)")
        sub.set_defaults(run=run)

    etl = commands.add_parser("etl", help="run the Spark ETL job in local mode (same as spark-submit etl/prepare.py)")
    from mpitrain.etl.cli import add_arguments
    add_arguments(etl)
    etl.set_defaults(run=_etl)

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
    """mpitrain's messages at INFO on rank 0 and WARNING elsewhere; other libraries' at WARNING, so
    their INFO chatter (numba-cuda's deallocations at exit, say) stays out of a run's log."""
    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s", stream=sys.stderr)
    logging.getLogger("mpitrain").setLevel(logging.INFO if rank == 0 else logging.WARNING)


def _train(args, comm) -> int:
    from mpitrain.config import load_config
    from mpitrain.train import train
    train(load_config(args.config, args.set + ([args.resume] if args.resume else [])), comm)
    return 0


def _eval(args, comm) -> int:
    from mpitrain.evaluate import evaluate
    from mpitrain.report import class_names, write_confusion_png
    trained = _load_trained(args, comm)
    result = evaluate(trained.model, trained.rows, trained.to_input, args.batch_size, comm,
                      trained.manifest.num_classes, trained.backend).to_dict()
    if comm.is_root:
        out = os.path.join(args.run_dir, f"eval-{args.split}.json")
        with open(out, "w") as f:
            json.dump({"checkpoint": trained.checkpoint, "split": args.split, **result}, f, indent=2)
        names = trained.manifest.class_names or class_names(trained.manifest.source, trained.manifest.num_classes)
        picture = os.path.join(args.run_dir, f"confusion-{args.split}.png")
        write_confusion_png(np.array(result["confusion"]), names, picture,
                            f"{os.path.basename(os.path.abspath(args.run_dir))}, {args.split}: "
                            f"accuracy {result['accuracy']:.4f}")
        print(f"{args.split}: accuracy {result['accuracy']:.4f}  loss {result['loss']:.4f}  "
              f"rows {result['rows']}  ({trained.checkpoint})")
        print(f"{'class':>12}  precision  recall")
        for name, p, r in zip(names, result["precision"], result["recall"]):
            print(f"{name:>12}  {p:9.4f}  {r:6.4f}")
        print(f"wrote {out} and {picture}")
    return 0


def _predict(args, comm) -> int:
    import h5py
    from mpitrain.evaluate import predict
    trained = _load_trained(args, comm)
    classes, probabilities = predict(trained.model, trained.rows, trained.to_input, args.batch_size, trained.backend)
    parts = comm.gather_obj((classes, probabilities, trained.rows.y))
    if comm.is_root:
        out = args.out or os.path.join(args.run_dir, f"predictions-{args.split}.h5")
        tmp = out + ".tmp"
        with h5py.File(tmp, "w") as f:
            f.create_dataset("predicted", data=np.concatenate([p[0] for p in parts]))
            f.create_dataset("probabilities", data=np.concatenate([p[1] for p in parts]))
            f.create_dataset("label", data=np.concatenate([p[2] for p in parts]))
            f.attrs.update(split=args.split, checkpoint=trained.checkpoint)
        os.replace(tmp, out)
        print(f"wrote {out}: {sum(len(p[0]) for p in parts)} rows of split {args.split!r}")
    return 0


class _Trained:
    """A run's model with a checkpoint's parameters, and this rank's evaluation rows of a split."""

    def __init__(self, model, rows, to_input, manifest, checkpoint, backend):
        self.model, self.rows, self.to_input = model, rows, to_input
        self.manifest, self.checkpoint, self.backend = manifest, checkpoint, backend


def _load_trained(args, comm) -> _Trained:
    from mpitrain.backend import create_backend
    from mpitrain.checkpoint import check_fits, list_checkpoints, load_checkpoint, restore_model
    from mpitrain.config import load_config
    from mpitrain.data import Batches, load_rank_rows
    from mpitrain.nn.model import build_model
    from mpitrain.shard_format import read_manifest

    with comm.agreed_errors():
        config_path = os.path.join(args.run_dir, "config.yaml")
        config = load_config(config_path, [f"run_dir={os.path.abspath(args.run_dir)}"])
        backend = create_backend(config.backend, comm.local_rank, comm.local_size)
        manifest = read_manifest(config.data.path)
        model = build_model(config.model, manifest.feature_shape, manifest.num_classes, backend.xp)
        checkpoints = list_checkpoints(config.run_dir)
        path = args.checkpoint or (checkpoints[-1] if checkpoints else None)
        if path is None:
            raise DataError(f"{config.run_dir}/checkpoints: no checkpoint; train first or pass --checkpoint")
        ckpt = load_checkpoint(path)
        check_fits(ckpt, model.layout + model.stats_layout)
        restore_model(ckpt, model, backend.to_device)
        rows = load_rank_rows(config.data.path, manifest, args.split, comm.rank, comm.size, training=False,
                              verify_checksums=config.data.verify_checksums)
    batches = Batches(rows, manifest, 1, backend, config.model.dtype, 0, comm.rank,
                      normalize=config.data.normalize, prefetch=False)
    return _Trained(model, rows, batches.to_model_input, manifest, path, backend)


def _report(args) -> int:
    from mpitrain.report import write_report
    out = args.out or (args.run_dirs[0] if len(args.run_dirs) == 1 else ".")
    print("wrote {} and {}".format(*write_report(args.run_dirs, out)))
    return 0


def _etl(args) -> int:
    from mpitrain.etl.cli import run
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return run(args)


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
