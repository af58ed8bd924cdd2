# README command 1: `make demo`; README command 2: `make test`. Both set themselves up.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
FASHION ?= /usr/share/datasets/fashion-mnist
RANKS ?= 2
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
# One node: UCX over shared memory only (pip MPICH's UCX network address exchange sometimes fails
# at MPI_Init on a single host, pmodels/mpich#7417). On a cluster, set UCX_TLS for its network.
export UCX_TLS ?= self,sm

.PHONY: setup bytecode fashion-mnist slurm network-tools demo test test-fast test-mpi lint bench bench-gpu gpu-pack gpu-check clean

setup: $(VENV)/.installed $(VENV)/.kernels

$(VENV)/.installed: setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[spark,mpich,test]'
	touch $@

# numba's cache filled with the CPU kernels training runs (`mpitrain warm-up`, two processes at once), so the first
# run after installing loads them instead of compiling them (docs/troubleshooting.md); again when a kernel changes.
$(VENV)/.kernels: $(VENV)/.installed mpitrain/training/kernel_cache.py $(wildcard kernels/*.py kernels/threshold/*.py)
	$(BIN)/mpitrain warm-up --part 1/2 & first=$$!; $(BIN)/mpitrain warm-up --part 2/2; second=$$?; \
	  wait $$first && [ $$second = 0 ]
	touch $@

# The bytecode of mpitrain's own modules, which an editable install leaves unwritten: with PYTHONDONTWRITEBYTECODE
# set, every rank and command would compile about 100 modules from source at each start (0.6 s of a config error's
# 1.3 s, docs/testing.md). Files already up to date are skipped; an edited module is compiled again here.
bytecode: setup
	$(PY) -m compileall -q mpitrain etl kernels tests/harness

# Fashion-MNIST comes from Debian's dataset-fashion-mnist; nothing is downloaded at run time.
fashion-mnist:
	@if [ ! -f $(FASHION)/train-images-idx3-ubyte.gz ] && [ ! -f $(FASHION)/train-images-idx3-ubyte ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; \
	  else echo "Fashion-MNIST IDX files not found in $(FASHION): run 'sudo apt-get install dataset-fashion-mnist'," \
	       "or point FASHION=/path/to/idx-folder at a folder holding train-images-idx3-ubyte[.gz] and friends"; exit 1; fi; \
	fi

# Debian's Slurm and munge, for tests/system/test_slurm.py and tests/system/test_cluster.py (they start their own daemons; nothing runs as a service).
slurm:
	@if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
	    || ! command -v munged >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	       --no-install-recommends slurmctld slurmd slurm-client munge; \
	  else echo "Slurm not found: run 'sudo apt-get install slurmctld slurmd slurm-client munge'" \
	       "(tests/system/test_slurm.py and the Slurm tests of tests/system/test_cluster.py skip without it, and fail under CI=true)"; fi; \
	fi

# ip, tc (iproute2), unshare and taskset (util-linux) for tests/system/test_cluster.py's simulated nodes (network namespaces).
network-tools:
	@if ! command -v ip >/dev/null || ! command -v tc >/dev/null || ! command -v unshare >/dev/null || ! command -v taskset >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	       --no-install-recommends iproute2 util-linux; \
	  else echo "ip/tc/unshare not found: run 'sudo apt-get install iproute2 util-linux'" \
	       "(tests/system/test_cluster.py skips without them, and fails under CI=true)"; fi; \
	fi

demo: setup bytecode fashion-mnist
	$(BIN)/mpitrain etl --source idx:$(FASHION) --out data/fashion --shards 8 --overwrite
	$(BIN)/mpitrain info data/fashion
	rm -rf runs/fashion_mlp
	$(BIN)/mpiexec -n $(RANKS) $(BIN)/mpitrain train configs/fashion_mlp.yaml
	$(BIN)/mpiexec -n $(RANKS) $(BIN)/mpitrain eval runs/fashion_mlp --split test

# Everything, as CI runs it: the linter, then tests/unit, tests/mpi and tests/system (real Spark, MPI, Slurm,
# simulated nodes; root installs the Debian packages they need): three pytest-xdist workers, one per layer, each
# running its layer in order (tests/conftest.py). At the end the 30 slowest tests, and the run's time against
# pyproject.toml's time_budget (docs/testing.md).
test: setup bytecode fashion-mnist slurm network-tools lint
	$(PY) -m pytest -q -n 3 --durations=30 tests

# The unit tests alone, on two workers: no MPI launcher, no Spark, no root (docs/testing.md: warm and cold times).
test-fast: setup bytecode
	$(PY) -m pytest -q -n 2 -m unit tests/unit

# The MPI layer alone: every test starts ranks with the venv's mpiexec, one test at a time.
test-mpi: setup bytecode
	$(PY) -m pytest -q -m mpi --durations=10 tests/mpi

# pyflakes' rules, pycodestyle's errors and isort's import order (pyproject.toml's [tool.ruff]).
lint: setup
	$(BIN)/ruff check .

bench: setup fashion-mnist
	$(PY) -m pip install -q -e '.[bench]' || echo "PyTorch not installed: the DDP baseline is left out"
	test -f data/fashion/manifest.json || $(BIN)/mpitrain etl --source idx:$(FASHION) --out data/fashion --shards 8
	$(PY) benchmarks/kernels.py
	$(PY) benchmarks/throughput.py --data data/fashion --out benchmarks/results
	$(PY) benchmarks/communication.py --data data/fashion --out benchmarks/results
	$(PY) benchmarks/cnn_accuracy.py --data data/fashion --out benchmarks/results
	$(PY) benchmarks/scaling.py --data data/fashion --out benchmarks/results
	$(PY) benchmarks/cluster.py --data data/fashion --out benchmarks/results
	$(PY) benchmarks/compression.py --data data/fashion --out benchmarks/results
	$(PY) benchmarks/soak.py --out benchmarks/results
	$(PY) benchmarks/etl.py --out benchmarks/results
	$(PY) benchmarks/streaming.py --data data/fashion --fashion $(FASHION) --out benchmarks/results
	$(PY) benchmarks/embeddings.py --out benchmarks/results
	$(PY) benchmarks/sharded_tables.py --out benchmarks/results
	$(PY) benchmarks/tables.py --out benchmarks/results
	$(PY) benchmarks/dbn.py --data data/fashion --out benchmarks/results
	$(PY) benchmarks/autoencoder.py --out benchmarks/results
	$(PY) benchmarks/recipes.py --out benchmarks/results
	$(PY) benchmarks/sequences.py --out benchmarks/results
	$(PY) -m mpitrain.testing.tables --results benchmarks/results --page docs/benchmarks.md --readme README.md

# One GPU: cupy and numba-CUDA kernels beside PyTorch CUDA; stops at once, saying so, without a GPU.
bench-gpu: setup fashion-mnist
	$(PY) -m pip install -q -e '.[gpu]'
	$(PY) -m pip install -q -e '.[bench]' || echo "PyTorch not installed: the PyTorch CUDA baseline is left out"
	test -f data/fashion/manifest.json || $(BIN)/mpitrain etl --source idx:$(FASHION) --out data/fashion --shards 8
	$(PY) benchmarks/kernels.py --backend cupy
	$(PY) benchmarks/throughput.py --backend cupy --data data/fashion --out benchmarks/results
	$(PY) -m mpitrain.testing.tables --results benchmarks/results --page docs/benchmarks.md --readme README.md

# The GPU check (docs/gpus.md#the-gpu-check): gpu-pack, here, puts into .gpu/ what a GPU machine without a package
# registry or Spark lacks; gpu-check, there, installs it and verifies, measures and reports in one command (it stops
# at once, saying so, without a GPU). `python benchmarks/gpu_check.py --dry-run` runs its steps on a CPU.
gpu-pack: setup fashion-mnist
	$(PY) benchmarks/gpu_pack.py --fashion $(FASHION) --out .gpu

gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) *.egg-info data runs
