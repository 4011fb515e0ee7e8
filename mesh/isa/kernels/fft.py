"""stablehlo.fft as DFT matrix products, the way a Tensor Engine computes a transform.

Trainium2 has no FFT unit and no complex arithmetic: a length-N transform along one axis is
a product with the N x N DFT matrix W[j, k] = exp(-2 pi i j k / N) (the inverse with
exp(+2 pi i j k / N) / N), done as real matrix products of the parts (4 for complex input,
2 for a real input, 2 for the real output of an inverse real transform), FP32 products
accumulated in FP32 (FP64 for complex128). Multi-dimensional transforms go axis by axis.
The matrix holds cos and sin rounded once to the parts' type, so the results differ from
an FFT's (which rounds O(log N) times per element) by about N x the type's epsilon
relative to the largest element.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import dtypes, isa
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext


# A transform's matrix is a constant of the program up to this many entries (16 MiB per
# FP32 part: N = 2048). A larger one is made in the program, a block of columns at a time,
# by indexing the table of its N distinct values with (j k) mod N: the same entries, where
# the whole matrix as a constant would be N^2 values that XLA holds and copies while
# compiling (N = 8192: 5 s and 1.5 GiB; N = 32768: minutes and 20 GiB). Making it costs
# each call about as much as the products (N = 4096: 20 ms a call, 4.5 ms as a constant).
CONSTANT_MAX_ENTRIES = 1 << 22
BLOCK_ENTRIES = 1 << 22  # entries of one block of a large matrix made at a time (16 MiB)


@dataclass(frozen=True, eq=False)  # eq=False: it holds a NumPy array
class _Matrix:
    """The [rows, cols] real and imaginary parts of a transform along one axis:
    entry (j, k) = (cos, sin)(sign 2 pi ((j k) mod n) / n), rounded to `part` and times
    `scale` in `part` (the inverse transform's 1/n); or, with `row_scale` (the inverse real
    transform's weights: 1 or 2, exact in any float), row_scale[j] (cos, sin)(...) / n in
    FP64, then rounded to `part`. Every value is computed as NumPy computes it (divisions
    on the host: XLA turns a division by a constant into a product with its reciprocal)."""

    rows: int
    cols: int
    n: int
    sign: float  # -2 (forward) or 2 (inverse)
    part: Any
    scale: float = 1.0
    row_scale: Any = None  # numpy float64 [rows], or None

    def _entries(self, j, k, xp):
        m = (j * k) % self.n
        angle = self.sign * np.pi * np.arange(self.n) / self.n
        if self.row_scale is None:
            tables = (np.cos(angle).astype(self.part), np.sin(angle).astype(self.part))
            if self.scale == 1:
                return tuple(xp.asarray(t)[m] for t in tables)
            scale = np.dtype(self.part).type(self.scale)
            return tuple(xp.asarray(t)[m] * scale for t in tables)
        weight = xp.asarray(self.row_scale)[j]
        return tuple((weight * xp.asarray(t / self.n)[m]).astype(self.part)
                     for t in (np.cos(angle), np.sin(angle)))

    def constant(self) -> tuple[jnp.ndarray, jnp.ndarray] | None:
        """Both parts as constants, when small enough (CONSTANT_MAX_ENTRIES)."""
        if self.rows * self.cols > CONSTANT_MAX_ENTRIES:
            return None
        j, k = np.meshgrid(np.arange(self.rows), np.arange(self.cols), indexing="ij")
        return tuple(jnp.asarray(w) for w in self._entries(j, k, np))

    def block(self, first_col, width: int) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Columns first_col .. first_col + width (a traced start), made in the program."""
        j = lax.broadcasted_iota(np.int64, (self.rows, width), 0)
        k = lax.broadcasted_iota(np.int64, (self.rows, width), 1) + first_col
        return self._entries(j, k, jnp)


def _dft(n_in: int, n_out: int, inverse: bool, part, scale: float = 1.0) -> _Matrix:
    """The [n_in, n_out] DFT matrix W[j, k] = exp(-+2 pi i j k / N); the length of the
    transform is max(n_in, n_out) (n_out is N/2+1 for RFFT's output)."""
    n = max(n_in, n_out) if n_in != n_out else n_in
    return _Matrix(n_in, n_out, n, 2.0 if inverse else -2.0, part, scale)


def _apply(re, im, matrix: _Matrix, axis: int, real_only: bool = False):
    """(re + i im) times the matrix along `axis` (im None: a real input): its real and
    imaginary parts, or with `real_only` its real part alone. A large matrix goes block by
    block of its columns (a loop of the program)."""
    dense = matrix.constant()
    if dense is not None:
        return _product(re, im, *dense, axis, real_only)
    width = max(1, min(matrix.cols, BLOCK_ENTRIES // matrix.rows))
    blocks = -(-matrix.cols // width)
    parts = lax.map(lambda b: _product(re, im, *matrix.block(b * width, width), axis,
                                       real_only),
                    jnp.arange(blocks, dtype=np.int64))

    def joined(stacked):  # [blocks, ..., width at axis, ...] -> [..., cols at axis, ...]
        moved = jnp.moveaxis(stacked, 0, axis)
        shape = moved.shape[:axis] + (blocks * width,) + moved.shape[axis + 2:]
        return lax.slice_in_dim(moved.reshape(shape), 0, matrix.cols, axis=axis)

    return tuple(joined(p) for p in parts)


def _product(re, im, w_re, w_im, axis: int, real_only: bool = False):
    """(re + i im) times W along `axis`: four real products (im None: two); with
    `real_only`, the two of the real part (re W_re - im W_im) as a 1-tuple."""
    def product(x, w):
        moved = jnp.moveaxis(x, axis, -1)
        out = lax.dot_general(moved, w, (((moved.ndim - 1,), (0,)), ((), ())),
                              precision=lax.Precision.HIGHEST,
                              preferred_element_type=w.dtype)
        return jnp.moveaxis(out, -1, axis)

    if real_only:
        return (product(re, w_re) - product(im, w_im),)
    if im is None:
        return product(re, w_re), product(re, w_im)
    return product(re, w_re) - product(im, w_im), product(re, w_im) + product(im, w_re)


@kernel(isa.Fft)
def fft(instr: isa.Fft, args, ctx: KernelContext):
    (x,) = args
    out_name = ctx.out_info(instr).type.dtype
    complex_name = out_name if out_name in dtypes.COMPLEX_PARTS else \
        {"float32": "complex64", "float64": "complex128"}[out_name]
    part = dtypes.numpy_dtype(dtypes.COMPLEX_PARTS[complex_name])
    rank = len(instr.fft_length)
    axes = list(range(x.ndim - rank, x.ndim))
    kind = instr.fft_type
    if kind == "RFFT":
        re, im = x.astype(part), None
    else:
        re, im = lax.real(x).astype(part), lax.imag(x).astype(part)
    inverse = kind in ("IFFT", "IRFFT")
    # the real axis (last) first for RFFT, last for IRFFT; the others are complex transforms
    order = axes[::-1] if kind == "RFFT" else axes
    for axis, n in zip(order, [instr.fft_length[a - axes[0]] for a in order]):
        last = axis == axes[-1]
        if kind == "RFFT" and last:
            re, im = _apply(re, None, _dft(n, n // 2 + 1, False, part), axis)
        elif kind == "IRFFT" and last:
            re = _inverse_real(re, im, n, part, axis)
            im = None
        else:
            re, im = _apply(re, im, _dft(n, n, inverse, part, 1.0 / n if inverse else 1.0),
                            axis)
    if kind == "IRFFT":
        return [re.astype(dtypes.numpy_dtype(out_name))]
    return [lax.complex(re, im).astype(dtypes.numpy_dtype(out_name))]


def _inverse_real(re, im, n: int, part, axis: int):
    """The real length-n signal whose half spectrum (n//2+1 values along `axis`) is given:
    Re(sum_k c_k X_k exp(2 pi i j k / n)) / n with c_k = 2 except at 0 and n/2 (numpy's
    irfft; the imaginary parts there do not count)."""
    half = n // 2 + 1
    k = np.arange(half)
    weight = np.where((k == 0) | ((n % 2 == 0) & (k == n // 2)), 1.0, 2.0)
    matrix = _Matrix(half, n, n, 2.0, part, row_scale=weight)  # [k, j]: c_k e^{2 pi i jk/n}/n
    re = lax.slice_in_dim(re, 0, half, axis=axis)
    im = lax.slice_in_dim(im, 0, half, axis=axis)
    (real,) = _apply(re, im, matrix, axis, real_only=True)
    return real
