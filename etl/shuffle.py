"""A seeded shuffle, stratified split carving and exact shard cuts, on whole numpy blocks.

Each row's key is a 64-bit hash of its content (features and label) and the seed, so the
order depends neither on the input's order nor on how Spark partitioned it, and identical
rows (equal keys) are interchangeable. Rows are range-partitioned by key and sorted within
each partition; the driver sees only per-partition class counts, from which it derives,
per partition, where its rows go: which output split (the first k_c rows of class c in key
order go to a carved split, so carving is stratified and exact) and which position in it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpitrain.kernels.activations import splitmix64
from mpitrain.kernels.rows import flat_rows


def row_keys(x: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """uint64 keys from each row's bytes and label: a seeded random linear hash, then splitmix64."""
    rows = flat_rows(np.ascontiguousarray(x)).view(np.uint8)
    pad = -rows.shape[1] % 8
    if pad:
        rows = np.concatenate([rows, np.zeros((len(rows), pad), np.uint8)], axis=1)
    words = rows.view(np.uint64)
    multipliers = np.random.default_rng([seed, words.shape[1]]).integers(0, 2**63, words.shape[1] + 1, np.uint64)
    multipliers |= np.uint64(1)
    with np.errstate(over="ignore"):
        total = (words * multipliers[:-1]).sum(axis=1, dtype=np.uint64)
        return splitmix64(total + y.astype(np.uint64) * multipliers[-1])


def strata(y: np.ndarray, target: str) -> np.ndarray:
    """What carving stratifies by (the `y` of `Placement.place`): the class of a class target, the outcome of a
    binary one; multilabel and regression targets are one stratum (carved by key order alone)."""
    if target == "class":
        return y
    if target == "binary":
        return y[:, 0].astype(np.int64)
    return np.zeros(len(y), np.int64)


ORDERS = ("shuffled", "label")  # --order: rows by their keys' hash, or by label first


def label_keys(keys: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Keys that sort rows by label first (the label in the top byte; labels < 256), then by `keys` (the hash):
    `--order label` writes a dataset stored by class, the worst case for a trainer's shuffle."""
    if len(y) and (y.min() < 0 or y.max() > 255):
        raise ValueError(f"--order label keeps labels 0..255 in a key's top byte, got {int(y.max())}")
    return (y.astype(np.uint64) << np.uint64(56)) | (keys >> np.uint64(8))


def key_partition(keys: np.ndarray, parts: int) -> np.ndarray:
    """Partition of each key when [0, 2**64) is cut into `parts` equal ranges (keys are uniform, so balanced)."""
    return ((keys >> np.uint64(32)) * np.uint64(parts)) >> np.uint64(32)


def group_ranks(groups: np.ndarray) -> np.ndarray:
    """For each element, how many earlier elements have the same group value."""
    order = np.argsort(groups, kind="stable")
    ordered = groups[order]
    ranks = np.empty(len(groups), np.int64)
    ranks[order] = np.arange(len(groups)) - np.searchsorted(ordered, ordered, side="left")
    return ranks


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Integers summing to `total`, proportional to `weights` (largest remainders get the leftover units)."""
    exact = total * weights / max(weights.sum(), 1)
    counts = np.floor(exact).astype(np.int64)
    leftover = total - counts.sum()
    counts[np.argsort(-(exact - counts), kind="stable")[:leftover]] += 1
    return counts


def carve_counts(class_counts: np.ndarray, fractions: list[float]) -> np.ndarray:
    """Rows per class for each carved split: fraction i of the rows left after splits 0..i-1, per class.

    Returns (len(fractions), classes); the totals are round(fraction * rows left), exactly.
    """
    left = class_counts.astype(np.int64)
    carved = []
    for fraction in fractions:
        carved.append(apportion(round(fraction * left.sum()), left))
        left = left - carved[-1]
    return np.array(carved, np.int64).reshape(len(fractions), len(class_counts))


@dataclass
class Placement:
    """Where the rows of each key partition of one source split go (shipped to the tasks).

    `outputs` are output split names: the carved ones first, the split keeping the rest last.
    Row r of class c with rank k among class c in key order goes to the first output i with
    k < bounds[i, c]; its position there counts the rows before it in key order.
    """

    outputs: list[str]
    bounds: np.ndarray  # (outputs - 1, classes) cumulative carved rows per class
    class_offset: np.ndarray  # (parts, classes) rows of each class in earlier partitions
    position_offset: np.ndarray  # (parts, outputs) rows of each output in earlier partitions
    rows: list[int]  # per output

    def place(self, part: int, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Output index and position of each row of partition `part` (rows in key order)."""
        rank = self.class_offset[part, y] + group_ranks(y)
        output = (rank[None, :] >= self.bounds[:, y]).sum(axis=0)
        return output, self.position_offset[part, output] + group_ranks(output)


def plan_placement(outputs: list[str], fractions: list[float], counts: np.ndarray) -> Placement:
    """The placement for per-partition class counts `counts` (parts, classes); one fraction per carved output."""
    carved = carve_counts(counts.sum(axis=0), fractions)
    bounds = np.cumsum(carved, axis=0)
    class_offset = np.cumsum(counts, axis=0) - counts
    # rows of class c in partition p going to carved output i: the overlap of their ranks with [b_{i-1}, b_i)
    edges = np.concatenate([np.zeros((1, counts.shape[1]), np.int64), bounds,
                            np.full((1, counts.shape[1]), np.iinfo(np.int64).max)])
    lo, hi = class_offset[:, None, :], (class_offset + counts)[:, None, :]
    per_output = (np.clip(np.minimum(hi, edges[None, 1:]) - np.maximum(lo, edges[None, :-1]), 0, None)).sum(axis=2)
    position_offset = np.cumsum(per_output, axis=0) - per_output
    return Placement(outputs, bounds, class_offset, position_offset, per_output.sum(axis=0).tolist())


def shard_of(position: np.ndarray, rows: int, shards: int) -> np.ndarray:
    """Shard i holds positions [i*rows//shards, (i+1)*rows//shards)."""
    return ((position + 1) * shards - 1) // rows
