"""The native pass loop (pass_matmul.cc, built by `pip install`): a matmul's passes summed
and accumulated in the order of the executor's XLA loop (mesh.isa.kernels.matmul), one tile
of the result at a time in registers and L1 rather than one whole pass product at a time in
memory.

It is an XLA FFI custom call on the CPU, registered with jax when this module is imported
(so that an executable that calls it can run however it was made: traced here, or read
from a compilation cache). `runs(dtype)` says whether it takes operands of that host type
here: BF16 and FP32, on a CPU with AVX-512 BF16, where the library was built.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

TARGET = "jax_trn2_pass_matmul"
HOST_DTYPES = (jnp.bfloat16, jnp.float32)


def _load() -> ctypes.CDLL | None:
    """The built library, registered with jax, when it is there and this CPU runs it."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_pass_matmul" + suffix)
        if os.path.exists(path):
            library = ctypes.CDLL(path)
            if not library.Available():
                return None
            jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(library.PassMatmul),
                                        platform="cpu")
            return library
    return None


_LIBRARY = _load()


def runs(host_dtype) -> bool:
    """Whether the native loop takes operands of `host_dtype` on this CPU."""
    return jnp.dtype(host_dtype) in HOST_DTYPES and _LIBRARY is not None


def offsets(shape: Sequence[int], dims: Sequence[int]) -> np.ndarray:
    """Where the elements along `dims` of a row-major array of `shape` are, in elements from
    its first: one offset per index of those dims, enumerated row-major in the order given
    (a dim not given is at index 0)."""
    strides = np.cumprod((tuple(shape[1:]) + (1,))[::-1], dtype=np.int64)[::-1]
    at = np.zeros(1, np.int64)
    for d in dims:
        at = (at[:, None] + np.arange(shape[d], dtype=np.int64) * strides[d]).reshape(-1)
    return at


def pass_matmul(lhs: jax.Array, rhs: jax.Array, pass_size: int, lhs_at: Sequence[np.ndarray],
                rhs_at: Sequence[np.ndarray], out_at: Sequence[np.ndarray],
                out_shape: Sequence[int]) -> jax.Array:
    """The FP32 array of `out_shape` whose element (b, m, n) is the sum over k of
    lhs(b, m, k) rhs(b, k, n), K cut into passes of `pass_size`, each summed in FP32, added
    in order (traceable, CPU only: under lax.platform_dependent). Operands of one host type,
    BF16 or FP32, in any layout the offset tables (`offsets`) describe:
    lhs(b, m, k) is lhs's element lhs_at[0][b] + lhs_at[1][m] + k (its contraction
    contiguous), rhs(b, k, n) is rhs_at[0][b] + rhs_at[1][k] + rhs_at[2][n], and the
    result's (b, m, n) out_at[0][b] + out_at[1][m] + out_at[2][n]."""
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct(tuple(out_shape), jnp.float32))
    with jax.enable_x64(True):  # offsets of arrays of 2^31 elements or more
        tables = [jnp.asarray(t, jnp.int64) for t in (*lhs_at, *rhs_at, *out_at)]
    return call(lhs, rhs, *tables, pass_size=np.int64(pass_size))
