"""Residuals for the threshold codec's tests, shared by the CPU tests and the CUDA check."""
from __future__ import annotations

import numpy as np


def residual_with_fraction(n: int, fraction: float, seed: int = 0, dtype=np.float32):
    """(normal residual, tau sending about `fraction` of it: 0 sends nothing, 1 everything)."""
    residual = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    magnitude = np.abs(residual)
    if n == 0 or fraction == 0:
        return residual, 2 * float(magnitude.max(initial=1.0))
    if fraction == 1:
        return residual, float(np.float32(magnitude.min()))
    return residual, float(np.quantile(magnitude, 1 - fraction))


def edge_cases() -> list[tuple[str, np.ndarray, float]]:
    """(name, residual, tau) every implementation must get exactly right."""
    tau = np.float32(0.25)
    below = np.nextafter(tau, np.float32(0))
    return [
        ("example", np.array([0.75, -0.25, -0.0, 0.125, 0.5], dtype=np.float32), 0.25),
        ("empty residual", np.zeros(0, dtype=np.float32), 0.25),
        ("nothing sent", *residual_with_fraction(100, 0)),
        ("everything sent", *residual_with_fraction(100, 1)),
        ("n < 16", *residual_with_fraction(15, 0.3)),
        ("n = 17", *residual_with_fraction(17, 0.3, seed=1)),
        ("+-tau exactly, -0.0, just below tau",
         np.array([tau, -tau, -0.0, 0.0, below, -below, 3 * tau, -5 * tau] * 3, dtype=np.float32), float(tau)),
        ("bit 31: element 15 sent negative", np.r_[np.zeros(15), -1.0].astype(np.float32), 0.5),
        ("float64", *residual_with_fraction(50, 0.2, seed=2, dtype=np.float64)),
    ]


def bits(array: np.ndarray) -> np.ndarray:
    """The array's bit patterns, so comparisons tell -0.0 from 0.0."""
    return array.view(np.dtype(f"u{array.itemsize}"))

