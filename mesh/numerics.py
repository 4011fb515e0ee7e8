"""Trainium2 arithmetic: what precision each engine computes in and where it rounds.

- Vector/Scalar/GpSimd engines compute elementwise ops on BF16/FP16/FP8 inputs in FP32 and
  round once to the output type (NKI docs: engines compute in FP32 internally).
- Rounding to a narrower float is round-to-nearest-even by default (AWS Neuron "rounding
  modes").
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from mesh import dtypes


def compute_dtype(name: str) -> str:
    """The type an engine computes values of type `name` in."""
    return "float32" if name in dtypes.LOW_PRECISION_FLOATS else name


def widen(x: jnp.ndarray) -> jnp.ndarray:
    """x in its compute type (exact: every narrow float is an FP32 value)."""
    name = dtypes.dtype_name(x.dtype)
    wide = compute_dtype(name)
    return x if wide == name else lax.convert_element_type(x, dtypes.numpy_dtype(wide))


def round_to(x: jnp.ndarray, name: str, rounding=None) -> jnp.ndarray:
    """x rounded once to element type `name` (round-to-nearest-even unless `rounding` says)."""
    target = dtypes.numpy_dtype(name)
    if x.dtype == target:
        return x
    if rounding is not None:
        return rounding(x, name)
    return lax.convert_element_type(x, target)
