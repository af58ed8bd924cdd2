#!/bin/bash
# Submit the ETL, then training that starts only when the ETL succeeded (--dependency=afterok):
#
#   slurm/pipeline.sh ETL_ARGS... -- CONFIG [TRAIN_ARGS...]
#   slurm/pipeline.sh --source idx:/usr/share/datasets/fashion-mnist --out data/fashion --shards 8 \
#       -- configs/fashion_mlp.yaml --set sync.mode=averaging
#
# Training reads what the ETL writes: it gets --set data.path=<the ETL's --out> (a later --set
# wins). Prints "etl job ID" and "train job ID". Extra sbatch options for each job:
# ETL_SBATCH_ARGS and TRAIN_SBATCH_ARGS (split at spaces), e.g. TRAIN_SBATCH_ARGS="--nodes=2".
# If the ETL fails, Slurm cancels the training job (--kill-on-invalid-dep=yes).
set -euo pipefail
slurm_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export MPITRAIN_REPO=${MPITRAIN_REPO:-$(dirname "$slurm_dir")}

etl_args=() out=""
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case $1 in
    --out) out=${2:-} ;;
    --out=*) out=${1#--out=} ;;
  esac
  etl_args+=("$1")
  shift
done
if [ $# -lt 2 ] || [ -z "$out" ]; then
  echo "usage: slurm/pipeline.sh --source SOURCE --out DATASET_DIR --shards N [ETL options] -- CONFIG.yaml [--set ...]" >&2
  exit 2
fi
shift  # the --
config=$1
shift

# shellcheck disable=SC2086  # the *_SBATCH_ARGS are lists of options
etl_job=$(sbatch --parsable ${ETL_SBATCH_ARGS:-} "$slurm_dir/etl.sbatch" "${etl_args[@]}")
echo "etl job ${etl_job%%;*}"
# shellcheck disable=SC2086
train_job=$(sbatch --parsable --dependency="afterok:${etl_job%%;*}" --kill-on-invalid-dep=yes ${TRAIN_SBATCH_ARGS:-} \
  "$slurm_dir/train.sbatch" "$config" --set "data.path=$out" "$@")
echo "train job ${train_job%%;*}"
