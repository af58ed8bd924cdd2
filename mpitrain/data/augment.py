"""Random left-right flips and shifts of training images, drawn per batch from its key.

Applied to the stored rows (N, C, H, W) before normalization, so the border a shift uncovers
is filled with the stored 0 (the background of Fashion-MNIST and MNIST). The key is
(seed, epoch, rank, step), as for the shuffle and dropout: a resumed run sees the same images. Under
`sync.deterministic` each micro-batch of the rank's rows draws by its own key, (seed, epoch, its place in the
global batch, step) (`augment_blocks`), so a row's flip and shift do not depend on the number of ranks.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

AUGMENT_DEFAULTS = {"flip": True, "shift": 2}


def augment_images(x: np.ndarray, key: tuple, flip: bool, shift: int) -> np.ndarray:
    """A new array: each image of `x` mirrored left-right with probability 1/2 (`flip`), then moved
    by a whole number of pixels in [-shift, shift] along each axis."""
    rng = np.random.default_rng(key)
    n, _, height, width = x.shape
    out = x.copy()
    if flip:
        mirrored = rng.random(n) < 0.5
        out[mirrored] = out[mirrored][..., ::-1]
    if shift:
        padded = np.pad(out, ((0, 0), (0, 0), (shift, shift), (shift, shift)))
        windows = sliding_window_view(padded, (height, width), axis=(2, 3))  # (n, C, 2s+1, 2s+1, H, W)
        down, right = rng.integers(0, 2 * shift + 1, size=(2, n))
        out = windows[np.arange(n), :, down, right]
    return out


def augment_blocks(x: np.ndarray, keys: list, flip: bool, shift: int) -> np.ndarray:
    """A new array: `augment_images` of each of `len(keys)` equal blocks of `x`'s rows, by its own key."""
    return np.concatenate([augment_images(block, key, flip, shift) for block, key in zip(np.split(x, len(keys)), keys)])
