"""Hyperparameter search as ordinary mpitrain jobs (Optuna, `pip install 'mpitrain[tune]'`): the study file
(`studyfile`), its folder and the one place trials are handed out (`storage`), the MPI worker (`worker`), local
workers (`launcher`) and the results (`results`). See docs/tuning.md."""
import warnings

from mpitrain.base.errors import MpitrainError

try:
    import optuna  # noqa: F401  (every module here needs it: say so once, as a user error)
except ImportError:
    raise MpitrainError("mpitrain tune needs Optuna: pip install 'mpitrain[tune]'") from None

# Optuna marks the retry callback's helpers and its matplotlib plots experimental, with a warning on every call:
# a worker's log would repeat them after every trial.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
