"""The streaming data path (mpitrain/data/): speed, a cold read, shuffle quality, bytes read, memory.

Every run starts mpitrain as the README does (`mpiexec -n N mpitrain train CONFIG --set ...`), in the
user's environment; the rows of a part run in one invocation, taking turns (`--repeat` rounds, median).

- speed: Fashion-MNIST MLP (2 epochs) and LeNet (1 epoch), 2 ranks. "in memory": the default
  data.buffer_mb (256) holds the whole split in one window, read at each epoch's start; "streaming":
  data.buffer_mb 8, windows of about 5,000 rows, the next one read during the steps of the one in use.
  Target: streaming >= 0.95x in memory, shards in the page cache.
- cold: the streaming MLP row with every shard dropped from the page cache before the run
  (posix_fadvise DONTNEED on each file: as cold as a machine without root over /proc/sys/vm allows).
- compression: the streaming MLP row on the same shards re-written with each codec (--compression: gzip,
  lz4, zstd, none), 2 ranks: does decoding in the batch thread (h5py holds its lock and, while HDF5's
  filters run, the GIL) stall the training thread? Samples/s and input wait against uncompressed shards.
- shuffle: Fashion-MNIST written sorted by label (`mpitrain etl --order label`), MLP 3 epochs, 2 ranks,
  beside the ETL's shuffled dataset, with the default buffer and with 8 MB. Target: the default buffer's
  test accuracy within 0.5 points of the shuffled dataset's.
- reading: the MLP for 1 epoch from SeaweedFS's S3 server on 127.0.0.1 (every read a ranged request the
  server answers: no page cache is shared), 1 and 4 ranks, windows of 8 and 64 MB: the bytes the server
  sent, all ranks, over the train split's stored bytes. Target: <= 1.5x on 4 ranks.
- memory: a generated table of 1 KB rows (Parquet, made into shards by the ETL) at 1x, 4x and 16x
  (170 MB to 2.7 GB), 2 ranks in one memory cgroup of 640 MB (cgroup v1, root), data.buffer_mb 64, 1 epoch:
  the largest rank's peak RSS (VmHWM). Targets: 16x within 64 MB of 1x; 16x (>= 4x the cgroup) completes.

    python benchmarks/streaming.py --data data/fashion --out benchmarks/results [--parts speed,cold,...]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile

import numpy as np

from common import BIN, USER_ENV, in_turns, markdown_table, median_run, train, write_results

PARTS = ("speed", "cold", "compression", "shuffle", "reading", "memory")
STREAMING_MB = 8
FASHION = "/usr/share/datasets/fashion-mnist"
MEMORY_LIMIT_MB = 640
MEMORY_SIZES = {"1x": 170_000, "4x": 680_000, "16x": 2_720_000}  # rows of 1 KB: 16x is 2.7 GB, over 4x the cgroup
TABLE_MODEL = {"model": {"layers": [{"type": "dense", "units": 32, "activation": "relu"}, {"type": "dense", "units": 10}]},
               "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9},
               "train": {"epochs": 1, "batch_size": 64, "log_every": 1000}, "report": False}


def etl(source: str, out: str, *options: str) -> None:
    subprocess.run([os.path.join(BIN, "mpitrain"), "etl", "--source", source, "--out", out, "--overwrite", *options],
                   check=True, env=USER_ENV, capture_output=True, text=True)


def dataset_bytes(path: str, split: str = "*") -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(path, split, "shard-*.h5")))


def drop_from_page_cache(path: str) -> None:
    for shard in glob.glob(os.path.join(path, "*", "shard-*.h5")):
        fd = os.open(shard, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def speed(args) -> list[dict]:
    """In memory vs streaming, MLP and LeNet, 2 ranks, taking turns; then the cold streaming MLP row."""
    rows = []
    for model, config, epochs in (("MLP", "configs/fashion_mlp.yaml", 2), ("LeNet", "configs/fashion_lenet.yaml", 1)):
        buffers = {"in memory": 256, "streaming": STREAMING_MB}
        runs = {name: [] for name in buffers}
        for _, name in in_turns(tuple(buffers), args.repeat):
            runs[name].append(train(2, config, {"data.path": args.data, "train.epochs": epochs,
                                                "train.batch_size": 64, "data.buffer_mb": buffers[name]}))
        base = median_run(runs["in memory"])["samples_per_s"]
        for name, summaries in runs.items():
            median = median_run(summaries)
            rows.append({"part": "speed", "model": model, "path": name, "buffer_mb": 256 if name == "in memory"
                         else STREAMING_MB, "samples_per_s": median["samples_per_s"],
                         "vs_in_memory": median["samples_per_s"] / base,
                         "input_wait_ms_per_step": median["input_wait_ms_per_step"],
                         "peak_rss_mb": median["peak_rss_mb"], "test_accuracy": median["test_accuracy"]})
    return rows


def cold(args, warm: float | None) -> list[dict]:
    drop_from_page_cache(args.data)
    summary = train(2, "configs/fashion_mlp.yaml", {"data.path": args.data, "train.epochs": 1,
                                                     "train.batch_size": 64, "data.buffer_mb": STREAMING_MB})
    return [{"part": "cold", "model": "MLP", "path": "streaming, cold", "buffer_mb": STREAMING_MB,
             "samples_per_s": summary["samples_per_s"],
             "vs_in_memory": summary["samples_per_s"] / warm if warm else None,
             "input_wait_ms_per_step": summary["input_wait_ms_per_step"], "peak_rss_mb": summary["peak_rss_mb"],
             "test_accuracy": summary["test_accuracy"]}]


def recompressed(path: str, out: str, compression: str) -> str:
    """The dataset at `path` with every shard re-written with `compression` (rows, order and chunks kept)."""
    import dataclasses

    import h5py

    from mpitrain.data.shards import read_manifest, write_manifest, write_shard
    manifest = read_manifest(path)
    splits = {}
    for split, shards in manifest.splits.items():
        splits[split] = []
        for shard in shards:
            with h5py.File(os.path.join(path, shard.path)) as f:
                splits[split].append(write_shard(out, shard.path, f["x"][...], f["y"][...], compression=compression))
    write_manifest(out, dataclasses.replace(manifest, splits=splits, compression=compression, checksums="fletcher32"))
    return out


def compression(args, work: str) -> list[dict]:
    """The streaming MLP on shards of each codec, taking turns; samples/s against uncompressed shards."""
    codecs = ("none", "gzip", "lz4", "zstd")
    paths = {codec: recompressed(args.data, os.path.join(work, f"fashion-{codec}"), codec) for codec in codecs}
    runs = {codec: [] for codec in codecs}
    for _, codec in in_turns(codecs, args.repeat):
        runs[codec].append(train(2, "configs/fashion_mlp.yaml", {"data.path": paths[codec], "train.epochs": 2,
                                                                  "data.buffer_mb": STREAMING_MB}))
    medians = {codec: median_run(r) for codec, r in runs.items()}
    return [{"part": "compression", "model": "MLP", "path": f"streaming, {codec}", "buffer_mb": STREAMING_MB,
             "samples_per_s": m["samples_per_s"], "vs_in_memory": m["samples_per_s"] / medians["none"]["samples_per_s"],
             "input_wait_ms_per_step": m["input_wait_ms_per_step"], "peak_rss_mb": m["peak_rss_mb"],
             "dataset_mb": dataset_bytes(paths[codec]) / 2**20, "test_accuracy": m["test_accuracy"]}
            for codec, m in medians.items()]


def shuffle(args, work: str) -> list[dict]:
    """Test accuracy after 3 epochs: the shuffled dataset, and Fashion-MNIST written sorted by label."""
    ordered = os.path.join(work, "fashion-by-label")
    etl(f"idx:{args.fashion}", ordered, "--shards", "8", "--order", "label")
    rows = []
    for name, path, buffer in (("shuffled by the ETL", args.data, 256), ("sorted by label", ordered, 256),
                               ("sorted by label", ordered, STREAMING_MB)):
        accuracies = [train(2, "configs/fashion_mlp.yaml", {"data.path": path, "train.epochs": 3,
                                                            "data.buffer_mb": buffer})["test_accuracy"]
                      for _ in range(args.repeat)]
        rows.append({"part": "shuffle", "model": "MLP", "path": name, "buffer_mb": buffer,
                     "test_accuracy": statistics.median(accuracies)})
    base = rows[0]["test_accuracy"]
    for row in rows:
        row["accuracy_points_vs_shuffled"] = 100 * (row["test_accuracy"] - base)
    return rows


def reading(args) -> list[dict]:
    """Bytes the S3 server sent per epoch over the dataset's size, 1 and 4 ranks."""
    from mpitrain.testing.objectstore import ObjectStore
    with ObjectStore() as store:
        env = {**USER_ENV, **store.env}
        store.make_bucket("bench")
        store.filesystem().put(args.data.rstrip("/") + "/", "bench/fashion/", recursive=True)
        size = dataset_bytes(args.data, "train")
        rows = []
        for buffer in (STREAMING_MB, 64):
            for ranks in (1, 4):
                summary = train(ranks, "configs/fashion_mlp.yaml", {
                    "data.path": "s3://bench/fashion", "train.epochs": 1, "train.global_batch_size": 256,
                    "data.buffer_mb": buffer}, env=env)
                rows.append({"part": "reading", "model": "MLP", "path": "s3://, SeaweedFS", "ranks": ranks,
                             "buffer_mb": buffer, "bytes_fetched": summary["data_bytes_fetched"],
                             "dataset_bytes": size, "fetched_over_dataset": summary["data_bytes_fetched"] / size,
                             "data_read_per_epoch": summary["data_read_per_epoch"],
                             "samples_per_s": summary["samples_per_s"]})
    return rows


def write_table(path: str, rows: int, seed: int) -> None:
    """`rows` rows of 1024 random bytes and a label in 0..9 (the argmax of 10 feature groups' sums), as Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    with pq.ParquetWriter(path, pa.schema([("features", pa.list_(pa.uint8(), 1024)), ("label", pa.int32())])) as out:
        for start in range(0, rows, 100_000):
            x = rng.integers(0, 256, (min(100_000, rows - start), 1024), dtype=np.uint8)
            y = x[:, :1000].reshape(len(x), 10, 100).sum(axis=2, dtype=np.int64).argmax(axis=1).astype(np.int32)
            features = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.uint8()), 1024)
            out.write_table(pa.table({"features": features, "label": pa.array(y)}))


def in_memory_cgroup(limit_mb: int) -> tuple[str, list[str]]:
    """A cgroup v1 memory group of `limit_mb` MB and the command prefix that starts a process in it."""
    group = f"/sys/fs/cgroup/memory/mpitrain-streaming-{os.getpid()}"
    try:
        os.makedirs(group)
        with open(os.path.join(group, "memory.limit_in_bytes"), "w") as f:
            f.write(str(limit_mb << 20))
    except OSError as e:
        raise SystemExit(f"{group}: {e}; the memory part needs root and cgroup v1's memory controller") from None
    return group, ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" "$@"']


def memory(args, work: str) -> list[dict]:
    """Peak RSS per rank at 1x, 4x and 16x, 2 ranks in one memory cgroup."""
    config = os.path.join(work, "table.yaml")
    with open(config, "w") as f:
        json.dump(TABLE_MODEL, f)
    group, prefix = in_memory_cgroup(MEMORY_LIMIT_MB)
    rows = []
    try:
        for name, n in MEMORY_SIZES.items():
            table, out = os.path.join(work, f"table-{name}.parquet"), os.path.join(work, f"table-{name}")
            write_table(table, n, seed=len(rows))
            etl(f"parquet:{table}", out, "--shards", str(max(2, n // 100_000)), "--label", "label",
                "--features", "features", "--feature-shape", "1024", "--feature-dtype", "uint8",
                "--test-fraction", "0.01", "--num-classes", "10")
            os.remove(table)
            summary = train(2, config, {"data.path": out, "data.buffer_mb": 64}, prefix=prefix)
            with open(os.path.join(group, "memory.max_usage_in_bytes")) as f:
                group_peak = int(f.read()) / 2**20
            rows.append({"part": "memory", "size": name, "rows": n, "dataset_mb": dataset_bytes(out) / 2**20,
                         "limit_mb": MEMORY_LIMIT_MB, "peak_rss_mb": summary["peak_rss_mb"],
                         "cgroup_peak_mb": group_peak, "samples_per_s": summary["samples_per_s"],
                         "epochs_done": summary["epochs"], "data_read_per_epoch": summary["data_read_per_epoch"]})
            shutil.rmtree(out)
    finally:
        os.rmdir(group)
    for row in rows:
        row["rss_over_1x_mb"] = row["peak_rss_mb"] - rows[0]["peak_rss_mb"]
    return rows


def markdown(rows: list[dict]) -> str:
    def number(value, spec):
        return "" if value is None else format(value, spec)
    parts = []
    speed_rows = [r for r in rows if r["part"] in ("speed", "cold")]
    if speed_rows:
        parts.append(markdown_table(
            ["model", "rows", "data.buffer_mb", "samples/s", "vs in memory", "input wait ms/step", "peak RSS MB"],
            [[r["model"], r["path"], str(r["buffer_mb"]), f"{r['samples_per_s']:,.0f}", number(r["vs_in_memory"], ".2f"),
              f"{r['input_wait_ms_per_step']:.2f}", f"{r['peak_rss_mb']:.0f}"] for r in speed_rows], "lllrrrr"))
    codec_rows = [r for r in rows if r["part"] == "compression"]
    if codec_rows:
        parts.append(markdown_table(
            ["model", "shards", "shards MB", "samples/s", "vs uncompressed", "input wait ms/step"],
            [[r["model"], r["path"], f"{r['dataset_mb']:.0f}", f"{r['samples_per_s']:,.0f}", f"{r['vs_in_memory']:.2f}",
              f"{r['input_wait_ms_per_step']:.2f}"] for r in codec_rows], "llrrrr"))
    shuffle_rows = [r for r in rows if r["part"] == "shuffle"]
    if shuffle_rows:
        parts.append(markdown_table(["dataset", "data.buffer_mb", "test accuracy", "points vs shuffled"],
                                    [[r["path"], str(r["buffer_mb"]), f"{r['test_accuracy']:.4f}",
                                      f"{r['accuracy_points_vs_shuffled']:+.2f}"] for r in shuffle_rows], "lrrr"))
    reading_rows = [r for r in rows if r["part"] == "reading"]
    if reading_rows:
        parts.append(markdown_table(["store", "data.buffer_mb", "ranks", "bytes sent by the server",
                                     "over the train split's bytes", "chunk rows read per epoch / rows"],
                                    [[r["path"], str(r["buffer_mb"]), str(r["ranks"]), f"{r['bytes_fetched']:,}",
                                      f"{r['fetched_over_dataset']:.2f}x", f"{r['data_read_per_epoch']:.3f}"]
                                     for r in reading_rows], "lrrrrr"))
    memory_rows = [r for r in rows if r["part"] == "memory"]
    if memory_rows:
        parts.append(markdown_table(["size", "rows", "shards MB", "cgroup limit MB", "peak RSS per rank MB",
                                     "over 1x MB", "epochs done"],
                                    [[r["size"], f"{r['rows']:,}", f"{r['dataset_mb']:,.0f}", str(r["limit_mb"]),
                                      f"{r['peak_rss_mb']:.0f}", f"{r['rss_over_1x_mb']:+.0f}", str(r["epochs_done"])]
                                     for r in memory_rows], "lrrrrrr"))
    return "\n\n".join(parts + [targets(rows)]) + "\n"


def targets(rows: list[dict]) -> str:
    """The targets of the module docstring, each met or not, from the rows."""
    def met(ok: bool) -> str:
        return "met" if ok else "NOT met"
    lines = []
    streaming = [r for r in rows if r["part"] == "speed" and r["path"] == "streaming"]
    if streaming:
        lines.append(f"streaming >= 0.95x in memory: {met(all(r['vs_in_memory'] >= 0.95 for r in streaming))} ("
                     + ", ".join(f"{r['model']} {r['vs_in_memory']:.2f}x" for r in streaming) + ")")
    shuffled = [r for r in rows if r["part"] == "shuffle" and r["path"] == "sorted by label" and r["buffer_mb"] == 256]
    if shuffled:
        points = shuffled[0]["accuracy_points_vs_shuffled"]
        lines.append(f"sorted by label, default buffer, within 0.5 points: {met(abs(points) <= 0.5)} ({points:+.2f})")
    four = [r for r in rows if r["part"] == "reading" and r["ranks"] == 4]
    if four:
        lines.append("bytes read <= 1.5x on 4 ranks: " + ", ".join(
            f"{r['buffer_mb']} MB windows {met(r['fetched_over_dataset'] <= 1.5)} ({r['fetched_over_dataset']:.2f}x)"
            for r in four))
    memory = {r["size"]: r for r in rows if r["part"] == "memory"}
    if "16x" in memory:
        big = memory["16x"]
        lines.append(f"16x within 64 MB of 1x: {met(big['rss_over_1x_mb'] <= 64)} ({big['rss_over_1x_mb']:+.0f} MB); "
                     f"16x >= 4x the cgroup and an epoch done: {met(big['dataset_mb'] >= 4 * big['limit_mb'] and big['epochs_done'] >= 1)}")
    return "Targets: " + "; ".join(lines) + "." if lines else ""


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="data/fashion", help="Fashion-MNIST shards (make demo writes them)")
    parser.add_argument("--fashion", default=FASHION, help="the IDX folder (shuffle part)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"some of {','.join(PARTS)}")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"--parts: {sorted(unknown)}; expected some of {PARTS}")
    rows = []
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(args.data))) as work:
        if "speed" in parts:
            rows += speed(args)
        if "cold" in parts:
            warm = next((r["samples_per_s"] for r in rows if r["model"] == "MLP" and r["path"] == "in memory"), None)
            rows += cold(args, warm)
        if "compression" in parts:
            rows += compression(args, work)
        if "shuffle" in parts:
            rows += shuffle(args, work)
        if "reading" in parts:
            rows += reading(args)
        if "memory" in parts:
            rows += memory(args, work)
    previous = os.path.join(args.out, "streaming.json")
    if os.path.exists(previous):  # the parts not run now keep their last rows
        with open(previous) as f:
            rows = [r for r in json.load(f)["rows"] if r["part"] not in parts and not (
                r["part"] == "cold" and "speed" in parts)] + rows
    rows.sort(key=lambda r: PARTS.index(r["part"]))
    result = {"rows": rows, "parts": sorted({r["part"] for r in rows}, key=PARTS.index)}
    write_results(args.out, "streaming", result, markdown(rows))
    return result


if __name__ == "__main__":
    main()
