"""What the GPU machine lacks, put into .gpu/ here for benchmarks/gpu_check.sh there (`make gpu-pack`).

That machine (Python 3.12, cupy, numba-cuda, PyTorch, h5py, mpi4py) reaches no package registry and has no Spark,
and a lease carries at most 64 MiB of working tree. So:

- .gpu/wheels: pip's MPICH (mpi4py there has no MPI library of its own); numpy < 2.5, as the `gpu` extra pins it
  (numba-cuda still calls np.row_stack, which numpy 2.5 removed); hdf5plugin with only the lz4 and zstd filters that
  mpitrain's shards use (the whole wheel is 46 MB, most of it filters mpitrain never writes);
- .gpu/wheels/if-missing: nvmath-python (the capturable GEMM of `train.cuda_graph`) and cuda-core, which it
  imports, each installed there only where that machine lacks it (its own cuda-core stays, numba-cuda's);
- .gpu/fashion: Fashion-MNIST's IDX files, the training split cut to its first TRAIN_IMAGES images (the whole one
  gzipped is 26 MB; the cut keeps the lease under its limit) and the test split whole.

    python benchmarks/gpu_pack.py [--fashion /usr/share/datasets/fashion-mnist] [--out .gpu]
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from mpitrain.etl.idx import IMAGES_MAGIC, LABELS_MAGIC, find_splits, read_records
from mpitrain.testing.datasets import write_idx

TRAIN_IMAGES = 30_000
WHEELS = ["mpich==5.0.2", "numpy==2.4.6", "hdf5plugin==7.1.0"]
IF_MISSING = ["nvmath-python==1.0.1", "cuda-core==1.2.2"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
KEPT_FILTERS = ("lz4", "zstd")  # mpitrain.data.shards.COMPRESSIONS beyond gzip
LIMIT = 64 << 20  # bytes a lease carries: the working tree and the carried paths together


def download_wheels(folder: str, wheels: list[str]) -> None:
    """`wheels` for CPython 3.12 on x86-64 Linux, without their dependencies (the machine has them)."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", folder, *wheels],
                   check=True)


def slim_hdf5plugin(folder: str) -> None:
    """Rewrite hdf5plugin's wheel with only KEPT_FILTERS' libraries, its build config naming only those, so that it
    registers them and looks for no other."""
    (wheel,) = glob.glob(os.path.join(folder, "hdf5plugin-*.whl"))
    slim = wheel + ".slim"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            name = os.path.basename(item.filename)
            if "/plugins/libh5" in item.filename and not name.startswith(tuple(f"libh5{f}." for f in KEPT_FILTERS)):
                continue
            data = source.read(item)
            if item.filename.endswith("/_config.py"):
                text = data.decode()
                start = text.index("'embedded_filters': (")
                end = text.index(")", start)
                data = (text[:start] + f"'embedded_filters': {KEPT_FILTERS!r}" + text[end + 1:]).encode()
            target.writestr(item, data)
    os.replace(slim, wheel)


def cut_fashion(source: str, folder: str) -> None:
    """Fashion-MNIST's IDX files: the training split's first TRAIN_IMAGES images and labels, the test split whole."""
    os.makedirs(folder, exist_ok=True)
    images, labels = find_splits(source)["train"]
    write_idx(Path(folder, "train-images-idx3-ubyte.gz"), read_records(images, 0, TRAIN_IMAGES), IMAGES_MAGIC)
    write_idx(Path(folder, "train-labels-idx1-ubyte.gz"), read_records(labels, 0, TRAIN_IMAGES), LABELS_MAGIC)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copyfile(os.path.join(source, name), os.path.join(folder, name))


def tree_bytes(repo: str) -> int:
    """Bytes of the files a lease sends besides the carried paths: tracked and untracked, not ignored."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                            check=True, capture_output=True).stdout.split(b"\0")
    return sum(os.path.getsize(os.path.join(repo, name.decode())) for name in listed
               if name and os.path.isfile(os.path.join(repo, name.decode())))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fashion", default=os.environ.get("FASHION", "/usr/share/datasets/fashion-mnist"))
    parser.add_argument("--out", default=".gpu")
    args = parser.parse_args(argv)
    shutil.rmtree(args.out, ignore_errors=True)
    wheels = os.path.join(args.out, "wheels")
    download_wheels(wheels, WHEELS)
    download_wheels(os.path.join(wheels, "if-missing"), IF_MISSING)
    slim_hdf5plugin(wheels)
    cut_fashion(args.fashion, os.path.join(args.out, "fashion"))
    packed = sum(os.path.getsize(os.path.join(folder, name)) for folder, _, names in os.walk(args.out)
                 for name in names)
    total = packed + tree_bytes(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(f"{args.out}: {packed / 2**20:.1f} MiB; with the working tree {total / 2**20:.1f} MiB of the lease's "
          f"{LIMIT >> 20} MiB")
    return 0 if total <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
