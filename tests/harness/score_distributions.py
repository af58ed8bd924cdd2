"""Scores as models give them, to measure the histogram mode's error against scikit-learn's exact AUC and average
precision (`mpitrain.training.distributed_scores`): tests/unit/training/test_distributed_scores.py at 10^6 rows, and
the figures the module's docstring gives at 10^7, from

    python -m mpitrain.testing.score_distributions --rows 10000000

`DISTRIBUTIONS`: name -> function(rng, n) -> (labels 0/1 int8 (n,), scores float64 (n,) in [0, 1]). Click-through
labels are drawn from the probabilities themselves (a calibrated model); the ties come from rounding, float16
outputs and a float32 sigmoid saturated at 0 and 1.
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def _sigmoid(z: np.ndarray, dtype=np.float32) -> np.ndarray:
    """A model's probabilities: computed and stored in `dtype` (so they tie, and saturate, as its outputs do)."""
    return (1 / (1 + np.exp(-z.astype(dtype)))).astype(np.float64)


def _drawn(rng, p: np.ndarray) -> np.ndarray:
    return (rng.random(p.size) < p).astype(np.int8)


def balanced(rng, n):
    labels = (rng.random(n) < 0.3).astype(np.int8)
    return labels, _sigmoid(rng.normal(np.where(labels, 1.0, -1.0), 1.5))


def click_through(rng, n, mean=-4.5, spread=1.2):
    p = _sigmoid(rng.normal(mean, spread, n))
    return _drawn(rng, p), p


def rare_clicks(rng, n):
    return click_through(rng, n, -7.5, 1.5)


def noisy_click_model(rng, n):
    z = rng.normal(-4.0, 1.5, n)
    return _drawn(rng, _sigmoid(z)), _sigmoid(z + rng.normal(0, 0.8, n))


def confident(rng, n):
    labels = (rng.random(n) < 0.5).astype(np.int8)
    return labels, _sigmoid(rng.normal(np.where(labels, 9.0, -9.0), 3.0))


def saturated(rng, n):
    labels = (rng.random(n) < 0.5).astype(np.int8)
    return labels, _sigmoid(rng.normal(np.where(labels, 12.0, -12.0), 12.0))  # many exactly 0 and 1 in float32


def rounded(rng, n):
    labels = (rng.random(n) < 0.2).astype(np.int8)
    return labels, np.round(np.clip(rng.normal(0.3 + 0.2 * labels, 0.2), 0, 1), 3)


def rounded_clicks(rng, n):
    labels = (rng.random(n) < 0.02).astype(np.int8)
    return labels, np.round(_sigmoid(rng.normal(-4 + 0.7 * labels, 1.0)), 3)


def float16_clicks(rng, n):
    labels = (rng.random(n) < 0.05).astype(np.int8)
    return labels, _sigmoid(rng.normal(-4.0 + labels, 1.2), np.float16)


DISTRIBUTIONS = {
    "balanced: 30% positive, sigmoid(N(+-1, 1.5))": balanced,
    "click-through 2%: calibrated, logit N(-4.5, 1.2)": click_through,
    "click-through 0.1%: calibrated, logit N(-7.5, 1.5)": rare_clicks,
    "click-through 4%: a noisy model of the true logit": noisy_click_model,
    "confident: sigmoid(N(+-9, 3))": confident,
    "saturated float32: sigmoid(N(+-12, 12)), 0 and 1 exactly": saturated,
    "ties: rounded to 3 decimals, 0 and 1 included": rounded,
    "ties: click-through 2% rounded to 3 decimals": rounded_clicks,
    "ties: click-through 5% in float16": float16_clicks,
}


def measure(n: int, seed: int = 0) -> list[dict]:
    """Each distribution's exact AUC and average precision (scikit-learn's) at `n` rows, and the histogram mode's
    errors beside them: its AUC minus the exact, the bound it reports, its average precision minus the exact."""
    from mpi4py import MPI
    from sklearn.metrics import average_precision_score, roc_auc_score

    from mpitrain.parallel.comm import Communicator
    from mpitrain.training.distributed_scores import histogram_scores

    comm, found = Communicator(MPI.COMM_SELF), []
    for number, (name, draw) in enumerate(DISTRIBUTIONS.items()):
        labels, scores = draw(np.random.default_rng([seed, number]), n)
        start = time.perf_counter()
        metrics, _ = histogram_scores(comm, "binary", labels, scores)
        seconds = time.perf_counter() - start
        auc, average_precision = roc_auc_score(labels, scores), average_precision_score(labels, scores)
        found.append({"distribution": name, "positives": float(labels.mean()), "auc": auc,
                      "auc_error": metrics["auc"] - auc, "auc_error_bound": metrics["auc_error_bound"],
                      "average_precision": average_precision,
                      "average_precision_error": metrics["average_precision"] - average_precision,
                      "histogram_seconds": seconds})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    found = measure(args.rows, args.seed)
    print(f"| distribution ({args.rows} rows) | AUC | AUC error | bound | AP | AP error | s |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for r in found:
        print(f"| {r['distribution']} | {r['auc']:.6f} | {r['auc_error']:+.1e} | {r['auc_error_bound']:.0e} | "
              f"{r['average_precision']:.6f} | {r['average_precision_error']:+.1e} | {r['histogram_seconds']:.2f} |")
    print(f"largest |AUC error| {max(abs(r['auc_error']) for r in found):.1e}, largest |AP error| "
          f"{max(abs(r['average_precision_error']) for r in found):.1e}")


if __name__ == "__main__":
    main()
