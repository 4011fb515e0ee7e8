"""Sub-byte integers (int2, uint2, int4, uint4) around XLA ops that mishandle them on CPU.

XLA on CPU rejects a variadic reduce or sort that mixes a sub-byte operand with others, and
top_k of a sub-byte operand. The kernels of those ops carry sub-byte values as 8-bit
integers of the same signedness (the same values, in the same order) and narrow results
back; what they compute is unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp

_SUB_BYTE = {"int2": jnp.int8, "int4": jnp.int8, "uint2": jnp.uint8, "uint4": jnp.uint8}


def to_bytes(x: jnp.ndarray) -> jnp.ndarray:
    """x as 8-bit integers when it is of a sub-byte integer type; else x."""
    wide = _SUB_BYTE.get(jnp.dtype(x.dtype).name)
    return x if wide is None else x.astype(wide)


def from_bytes(x: jnp.ndarray, dtype) -> jnp.ndarray:
    """x (from `to_bytes`) back in `dtype`."""
    return x if x.dtype == dtype else x.astype(dtype)
