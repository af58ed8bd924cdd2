#!/usr/bin/env bash
# The GPU check on a GPU machine (make gpu-check; docs/gpus.md): install what `make gpu-pack` put into .gpu/ (that
# machine reaches no package registry) and mpitrain itself, then run benchmarks/gpu_check.py. Results in $OUT
# (the device tool's output folder), else benchmarks/results/gpu-check. Without a GPU it stops at once, saying so.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu_check.sh: no GPU here (nvidia-smi lists none); nothing was run. On a CPU: python benchmarks/gpu_check.py --dry-run" >&2
  exit 2
fi
if [ ! -d .gpu/wheels ] || [ ! -d .gpu/fashion ]; then
  echo "gpu_check.sh: .gpu/ is missing: run make gpu-pack on a machine with pip's index, and carry .gpu" >&2
  exit 2
fi
$PY -m pip install -q --no-index --no-deps --no-cache-dir .gpu/wheels/*.whl || exit 2
for wheel in .gpu/wheels/if-missing/*.whl; do  # nvmath-python and cuda-core, where this machine lacks them
  [ -e "$wheel" ] || continue
  name=$(basename "$wheel" | cut -d- -f1 | tr _ -)
  $PY -m pip show -q "$name" >/dev/null 2>&1 || $PY -m pip install -q --no-index --no-deps --no-cache-dir "$wheel" || exit 2
done
$PY -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir -e . || exit 2
export UCX_TLS=${UCX_TLS:-self,sm} PYTHONUNBUFFERED=1
# numba's CPU kernels compiled once, on 4 of the machine's cores, while the GPU tests run
BIN=$(dirname "$(command -v $PY)")
mkdir -p "$OUT/logs"
for part in 1 2 3 4; do "$BIN/mpitrain" warm-up --part $part/4 > "$OUT/logs/warm-up-$part.log" 2>&1 & done
$PY benchmarks/gpu_check.py --fashion .gpu/fashion --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu-check.log"
status=${PIPESTATUS[0]}
wait
# a lease brings back 8 files at most: the step logs travel as one archive
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
exit $status
