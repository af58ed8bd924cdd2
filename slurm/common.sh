# Sourced by train.sbatch and etl.sbatch after they set MPITRAIN_REPO: the environment both share.
#
#   MPITRAIN_REPO  the mpitrain checkout (default: the folder above the submitted script)
#   MPITRAIN_VENV  the virtual environment mpitrain is installed in (default: $MPITRAIN_REPO/.venv,
#                  what `make setup` makes); its bin/ goes first on the PATH
set -euo pipefail
MPITRAIN_VENV=${MPITRAIN_VENV:-$MPITRAIN_REPO/.venv}
if [ ! -x "$MPITRAIN_VENV/bin/mpitrain" ]; then
  echo "error: $MPITRAIN_VENV/bin/mpitrain not found; set MPITRAIN_VENV to the virtual environment" \
       "mpitrain is installed in ('make setup' makes $MPITRAIN_REPO/.venv)" >&2
  exit 2
fi
export PATH="$MPITRAIN_VENV/bin:$PATH"
# Spark executors run this Python (and so this mpitrain), on every node.
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$MPITRAIN_VENV/bin/python}
export PYTHONUNBUFFERED=1
# Relative paths in arguments and configs (data/..., runs/...) are relative to the submit folder.
cd "$SLURM_SUBMIT_DIR"
echo "[slurm] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (restart ${SLURM_RESTART_COUNT:-0}); venv $MPITRAIN_VENV"
