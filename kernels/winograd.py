"""Winograd's minimal filtering F(2x2, 3x3) for 3x3 convolutions of stride 1 on the CPU (Lavin & Gray 2016).

    winograd_weights(W, U)                       # U (16, C, F) = G w G^T of each (filter, channel) 3x3 kernel
    winograd_weights_adjoint(dU, dW)             # dW (F, C, 3, 3) = G^T du G: the weights' gradient from U's
    padded_channels_last(x, g, image)            # image (N, Hp, Wp, C) = x (N, C, H, W) transposed, zero-padded
    winograd_inputs(image, g, V)                 # V (16, N*TH*TW, C) = B^T d B of each 4x4 tile (stride 2)
    winograd_outputs(M, rows)                    # rows (N, OH, OW, F) = A^T m A of each tile of M (16, T, F)
    winograd_outputs_adjoint(dz, dM)             # dM (16, T, F) = A dz A^T of each tile of dz (N, OH, OW, F)
    winograd_inputs_adjoint(dV, g, image, dx)    # dx (N, C, H, W) = the tiles' B dv B^T added up in `image`

A 3x3 convolution's output, taken 2x2 pixels at a time, is A^T [(G w G^T) * (B^T d B)] A of the 4x4
input tile d under it (`*` element by element): 16 products per tile and channel where the windows
of im2col take 36. Summed over the input channels, each of the 16 tile positions p is one GEMM,
M[p] (tiles, F) = V[p] (tiles, C) @ U[p] (C, F), so a layer runs 16 GEMMs on 4/9 of im2col's
windows' bytes with 4/9 of its multiplications. The gradients are the same GEMMs transposed:
dU[p] = V[p]^T dM[p] and dV[p] = dM[p] U[p]^T, between the adjoints of the transforms.

Every kernel works channels last (a tile's C channels, or F filters, are one run of memory), so
its inner loop is one vector operation per tile position; the transforms are adds and
subtractions only. The input is first copied, transposed, into a zero-padded (N, Hp, Wp, C)
image large enough for every tile, so no tile tests its bounds. Tiles past an odd output size
are computed and dropped (their gradient is zero). The kernels are numba, parallel over images,
and write into arrays they are given (the layer's workspace): a step allocates nothing. The
conv2d layer (mpitrain/nn/conv.py) is their only user and calls them on numpy arrays alone; it
is compared in the tests with its im2col path, which a GPU keeps.
"""
from __future__ import annotations

from numba import njit, prange
from numba.extending import register_jitable

# G, 4 x 3: the weights' transform of F(2x2, 3x3); B^T and A^T are written out in the kernels below.
G = ((1.0, 0.0, 0.0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0.0, 0.0, 1.0))


def tiles(g) -> tuple[int, int]:
    """The (rows, columns) of 2x2 output tiles that cover geometry `g`'s output."""
    return (g.out_height + 1) // 2, (g.out_width + 1) // 2


def padded_size(g) -> tuple[int, int]:
    """The (height, width) of the padded image that holds every tile's 4x4 inputs of geometry `g`."""
    rows, columns = tiles(g)
    return max(2 * rows + 2, g.pad_top + g.height), max(2 * columns + 2, g.pad_left + g.width)


@njit(cache=True)
def winograd_weights(w, out):
    """out[4a+b, c, f] = (G w[f, c] G^T)[a, b] for weights w (F, C, 3, 3)."""
    f_count, c_count = w.shape[0], w.shape[1]
    for f in range(f_count):
        for c in range(c_count):
            for a in range(4):
                for b in range(4):
                    total = 0.0
                    for i in range(3):
                        for j in range(3):
                            total += G[a][i] * w[f, c, i, j] * G[b][j]
                    out[4 * a + b, c, f] = total


@njit(cache=True)
def winograd_weights_adjoint(du, out):
    """out[f, c] (3x3) = G^T du[:, c, f] G: the adjoint of `winograd_weights`."""
    c_count, f_count = du.shape[1], du.shape[2]
    for f in range(f_count):
        for c in range(c_count):
            for i in range(3):
                for j in range(3):
                    total = 0.0
                    for a in range(4):
                        for b in range(4):
                            total += G[a][i] * du[4 * a + b, c, f] * G[b][j]
                    out[f, c, i, j] = total


@register_jitable
def _tile(b, k, per_image, columns):
    """Tile k of image b: its index among a chunk's tiles and its first row and column (of the outputs, and of
    the padded image's inputs)."""
    return b * per_image + k, 2 * (k // columns), 2 * (k % columns)


def padded_channels_last(x, g, image) -> None:
    """image (N, Hp, Wp, C) = x (N, C, H, W) at (pad_top, pad_left), zeros around it."""
    _padded_channels_last(x, g.pad_top, g.pad_left, image)


@njit(parallel=True, cache=True)
def _padded_channels_last(x, pad_top, pad_left, image):
    n, c_count, h, w = x.shape
    hp, wp = image.shape[1], image.shape[2]
    for b in prange(n):
        for r in range(hp):
            for q in range(wp):
                inside = pad_top <= r < pad_top + h and pad_left <= q < pad_left + w
                for c in range(c_count):
                    image[b, r, q, c] = x[b, c, r - pad_top, q - pad_left] if inside else 0


def winograd_inputs(image, g, out) -> None:
    """out[4a+b, t, :] = (B^T d B)[a, b] of tile t = (image, i, j) of geometry `g`, whose inputs are
    d = image[., 2i:2i+4, 2j:2j+4, :]."""
    _winograd_inputs(image, tiles(g)[1], out)


@njit(parallel=True, cache=True)
def _winograd_inputs(image, columns, out):
    n, c_count = image.shape[0], image.shape[3]
    per_image = out.shape[1] // n
    for b in prange(n):
        for k in range(per_image):
            t, r, q = _tile(b, k, per_image, columns)
            for c in range(c_count):
                d00, d01, d02, d03 = image[b, r, q, c], image[b, r, q + 1, c], image[b, r, q + 2, c], image[b, r, q + 3, c]
                d10, d11, d12, d13 = image[b, r + 1, q, c], image[b, r + 1, q + 1, c], image[b, r + 1, q + 2, c], \
                    image[b, r + 1, q + 3, c]
                d20, d21, d22, d23 = image[b, r + 2, q, c], image[b, r + 2, q + 1, c], image[b, r + 2, q + 2, c], \
                    image[b, r + 2, q + 3, c]
                d30, d31, d32, d33 = image[b, r + 3, q, c], image[b, r + 3, q + 1, c], image[b, r + 3, q + 2, c], \
                    image[b, r + 3, q + 3, c]
                # rows: B^T d
                e00, e01, e02, e03 = d00 - d20, d01 - d21, d02 - d22, d03 - d23
                e10, e11, e12, e13 = d10 + d20, d11 + d21, d12 + d22, d13 + d23
                e20, e21, e22, e23 = d20 - d10, d21 - d11, d22 - d12, d23 - d13
                e30, e31, e32, e33 = d10 - d30, d11 - d31, d12 - d32, d13 - d33
                # columns: (B^T d) B
                out[0, t, c], out[1, t, c], out[2, t, c], out[3, t, c] = e00 - e02, e01 + e02, e02 - e01, e01 - e03
                out[4, t, c], out[5, t, c], out[6, t, c], out[7, t, c] = e10 - e12, e11 + e12, e12 - e11, e11 - e13
                out[8, t, c], out[9, t, c], out[10, t, c], out[11, t, c] = e20 - e22, e21 + e22, e22 - e21, e21 - e23
                out[12, t, c], out[13, t, c], out[14, t, c], out[15, t, c] = e30 - e32, e31 + e32, e32 - e31, e31 - e33


def winograd_outputs(m, out) -> None:
    """out (N, OH, OW, F) = A^T m A of each tile of m (16, N*TH*TW, F); the rows and columns of a tile past OH or
    OW are dropped."""
    _winograd_outputs(m, out)


@njit(parallel=True, cache=True)
def _winograd_outputs(m, out):
    n, oh, ow, f_count = out.shape
    columns = (ow + 1) // 2
    per_image = (oh + 1) // 2 * columns
    for b in prange(n):
        for k in range(per_image):
            t, r, q = _tile(b, k, per_image, columns)
            for f in range(f_count):
                # rows: A^T m
                s0 = m[0, t, f] + m[4, t, f] + m[8, t, f]
                s1 = m[1, t, f] + m[5, t, f] + m[9, t, f]
                s2 = m[2, t, f] + m[6, t, f] + m[10, t, f]
                s3 = m[3, t, f] + m[7, t, f] + m[11, t, f]
                u0 = m[4, t, f] - m[8, t, f] - m[12, t, f]
                u1 = m[5, t, f] - m[9, t, f] - m[13, t, f]
                u2 = m[6, t, f] - m[10, t, f] - m[14, t, f]
                u3 = m[7, t, f] - m[11, t, f] - m[15, t, f]
                # columns: (A^T m) A
                out[b, r, q, f] = s0 + s1 + s2
                if q + 1 < ow:
                    out[b, r, q + 1, f] = s1 - s2 - s3
                if r + 1 < oh:
                    out[b, r + 1, q, f] = u0 + u1 + u2
                    if q + 1 < ow:
                        out[b, r + 1, q + 1, f] = u1 - u2 - u3


def winograd_outputs_adjoint(dz, out) -> None:
    """out (16, N*TH*TW, F) = A dz A^T of each tile of dz (N, OH, OW, F), 0 past OH or OW: the adjoint of
    `winograd_outputs`."""
    _winograd_outputs_adjoint(dz, out)


@njit(parallel=True, cache=True)
def _winograd_outputs_adjoint(dz, out):
    n, oh, ow, f_count = dz.shape
    columns = (ow + 1) // 2
    per_image = (oh + 1) // 2 * columns
    for b in prange(n):
        for k in range(per_image):
            t, r, q = _tile(b, k, per_image, columns)
            low, right = r + 1 < oh, q + 1 < ow
            for f in range(f_count):
                z00 = dz[b, r, q, f]
                z01 = dz[b, r, q + 1, f] if right else z00 * 0
                z10 = dz[b, r + 1, q, f] if low else z00 * 0
                z11 = dz[b, r + 1, q + 1, f] if low and right else z00 * 0
                # rows: A dz
                a0, a1, a2, a3 = z00, z00 + z10, z00 - z10, -z10
                c0, c1, c2, c3 = z01, z01 + z11, z01 - z11, -z11
                # columns: (A dz) A^T
                out[0, t, f], out[1, t, f], out[2, t, f], out[3, t, f] = a0, a0 + c0, a0 - c0, -c0
                out[4, t, f], out[5, t, f], out[6, t, f], out[7, t, f] = a1, a1 + c1, a1 - c1, -c1
                out[8, t, f], out[9, t, f], out[10, t, f], out[11, t, f] = a2, a2 + c2, a2 - c2, -c2
                out[12, t, f], out[13, t, f], out[14, t, f], out[15, t, f] = a3, a3 + c3, a3 - c3, -c3


def winograd_inputs_adjoint(dv, g, image, out) -> None:
    """out (N, C, H, W) = the sum over tiles of B dv B^T (dv (16, N*TH*TW, C)) at each tile's inputs: the adjoint
    of `winograd_inputs` after `padded_channels_last`, added up in `image` (N, Hp, Wp, C), which it overwrites."""
    _winograd_inputs_adjoint(dv, tiles(g)[1], g.pad_top, g.pad_left, image, out)


@njit(parallel=True, cache=True)
def _winograd_inputs_adjoint(dv, columns, pad_top, pad_left, image, out):
    n, c_count, h, w = out.shape
    per_image = dv.shape[1] // n
    for b in prange(n):  # one thread per image: its scatter never races
        image[b] = 0
        for k in range(per_image):
            t, r, q = _tile(b, k, per_image, columns)
            for c in range(c_count):
                v00, v01, v02, v03 = dv[0, t, c], dv[1, t, c], dv[2, t, c], dv[3, t, c]
                v10, v11, v12, v13 = dv[4, t, c], dv[5, t, c], dv[6, t, c], dv[7, t, c]
                v20, v21, v22, v23 = dv[8, t, c], dv[9, t, c], dv[10, t, c], dv[11, t, c]
                v30, v31, v32, v33 = dv[12, t, c], dv[13, t, c], dv[14, t, c], dv[15, t, c]
                # rows: B dv
                e00, e01, e02, e03 = v00, v01, v02, v03
                e10, e11, e12, e13 = v10 - v20 + v30, v11 - v21 + v31, v12 - v22 + v32, v13 - v23 + v33
                e20, e21, e22, e23 = v10 + v20 - v00, v11 + v21 - v01, v12 + v22 - v02, v13 + v23 - v03
                e30, e31, e32, e33 = -v30, -v31, -v32, -v33
                # columns: (B dv) B^T, added to the tile's 4x4 inputs
                image[b, r, q, c] += e00
                image[b, r, q + 1, c] += e01 - e02 + e03
                image[b, r, q + 2, c] += e01 + e02 - e00
                image[b, r, q + 3, c] -= e03
                image[b, r + 1, q, c] += e10
                image[b, r + 1, q + 1, c] += e11 - e12 + e13
                image[b, r + 1, q + 2, c] += e11 + e12 - e10
                image[b, r + 1, q + 3, c] -= e13
                image[b, r + 2, q, c] += e20
                image[b, r + 2, q + 1, c] += e21 - e22 + e23
                image[b, r + 2, q + 2, c] += e21 + e22 - e20
                image[b, r + 2, q + 3, c] -= e23
                image[b, r + 3, q, c] += e30
                image[b, r + 3, q + 1, c] += e31 - e32 + e33
                image[b, r + 3, q + 2, c] += e31 + e32 - e30
                image[b, r + 3, q + 3, c] -= e33
        for c in range(c_count):
            for r in range(h):
                for q in range(w):
                    out[b, c, r, q] = image[b, r + pad_top, q + pad_left, c]
