"""The native pass loop (pass_matmul.cc, built by `pip install`): a matmul's passes summed
and accumulated in the order of the executor's XLA loop (mesh.isa.kernels.matmul), one tile
of the result at a time in registers and L1 rather than one whole pass product at a time in
memory.

It is an XLA FFI custom call on the CPU, registered with jax when first used. `runs(dtype)`
says whether it takes operands of that host type here: BF16 and FP32, on a CPU with AVX-512
BF16, where the library was built.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import os

import jax
import jax.numpy as jnp
import numpy as np

TARGET = "jax_trn2_pass_matmul"
HOST_DTYPES = (jnp.bfloat16, jnp.float32)


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The built library, when it is there and this CPU runs it."""
    here = os.path.dirname(os.path.abspath(__file__))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(here, "_pass_matmul" + suffix)
        if os.path.exists(path):
            library = ctypes.CDLL(path)
            return library if library.Available() else None
    return None


@functools.cache
def _registered() -> str:
    jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(_library().PassMatmul),
                                platform="cpu")
    return TARGET


def runs(host_dtype) -> bool:
    """Whether the native loop takes operands of `host_dtype` on this CPU."""
    return jnp.dtype(host_dtype) in HOST_DTYPES and _library() is not None


def pass_matmul(lhs: jax.Array, rhs: jax.Array, pass_size: int,
                rhs_k_major: bool) -> jax.Array:
    """[B,M,K] x [B,K,N] (`rhs_k_major`) or [B,N,K] -> [B,M,N] in FP32: K cut into passes of
    `pass_size`, each summed in FP32, added in order (traceable, CPU only: under
    lax.platform_dependent). Operands of one host type, BF16 or FP32."""
    batch, m, _ = lhs.shape
    n = rhs.shape[2] if rhs_k_major else rhs.shape[1]
    call = jax.ffi.ffi_call(_registered(), jax.ShapeDtypeStruct((batch, m, n), jnp.float32))
    return call(lhs, rhs, pass_size=np.int64(pass_size), rhs_k_major=rhs_k_major)
