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

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import dtypes, isa
from mesh.isa.kernels import kernel
from mesh.isa.kernels.context import KernelContext


def _dft(n_in: int, n_out: int, inverse: bool, part) -> tuple[np.ndarray, np.ndarray]:
    """(real, imaginary) parts of the [n_in, n_out] DFT matrix, in the parts' type; the
    length of the transform is max(n_in, n_out) (n_out is N/2+1 for RFFT's output)."""
    n = max(n_in, n_out) if n_in != n_out else n_in
    j, k = np.meshgrid(np.arange(n_in), np.arange(n_out), indexing="ij")
    angle = (2 if inverse else -2) * np.pi * ((j * k) % n) / n
    return np.cos(angle).astype(part), np.sin(angle).astype(part)


def _apply(re, im, w_re, w_im, axis: int):
    """(re + i im) times W along `axis`: four real products (im None: two)."""
    def product(x, w):
        moved = jnp.moveaxis(x, axis, -1)
        out = lax.dot_general(moved, w, (((moved.ndim - 1,), (0,)), ((), ())),
                              precision=lax.Precision.HIGHEST,
                              preferred_element_type=w.dtype)
        return jnp.moveaxis(out, -1, axis)

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
            w_re, w_im = _dft(n, n // 2 + 1, False, part)
            re, im = _apply(re, None, jnp.asarray(w_re), jnp.asarray(w_im), axis)
        elif kind == "IRFFT" and last:
            re = _inverse_real(re, im, n, part, axis)
            im = None
        else:
            w_re, w_im = _dft(n, n, inverse, part)
            scale = 1.0 / n if inverse else 1.0
            re, im = _apply(re, im, jnp.asarray(w_re * scale), jnp.asarray(w_im * scale), axis)
    if kind == "IRFFT":
        return [re.astype(dtypes.numpy_dtype(out_name))]
    return [lax.complex(re, im).astype(dtypes.numpy_dtype(out_name))]


def _inverse_real(re, im, n: int, part, axis: int):
    """The real length-n signal whose half spectrum (n//2+1 values along `axis`) is given:
    Re(sum_k c_k X_k exp(2 pi i j k / n)) / n with c_k = 2 except at 0 and n/2 (numpy's
    irfft; the imaginary parts there do not count)."""
    half = n // 2 + 1
    k, j = np.meshgrid(np.arange(half), np.arange(n), indexing="ij")
    weight = np.where((k == 0) | ((n % 2 == 0) & (k == n // 2)), 1.0, 2.0)[:, :1]
    angle = 2 * np.pi * ((k * j) % n) / n
    w_re = jnp.asarray((weight * np.cos(angle) / n).astype(part))
    w_im = jnp.asarray((-weight * np.sin(angle) / n).astype(part))
    re = lax.slice_in_dim(re, 0, half, axis=axis)
    im = lax.slice_in_dim(im, 0, half, axis=axis)
    real, _ = _apply(re, None, w_re, w_im, axis)
    imag_contribution, _ = _apply(im, None, w_im, w_re, axis)
    return real + imag_contribution
