"""Float formats the host's XLA cannot compute with (the MX formats FP6 E2M3 and E3M2).

Their values are held in a wider float that represents each of them exactly
(mesh.dtypes.STORAGE_TYPES); what makes a value one of the format is the rounding here, which
converts as ml_dtypes (and XLA, for the formats it has) do: round to nearest, ties to even, on
the format's grid (subnormals included); a magnitude beyond the largest finite value, and an
infinity, saturates to it (the formats have no infinity and no NaN); a NaN becomes -0.0,
as XLA converts to FP4 E2M1 (ml_dtypes would keep the opposite of the NaN's sign bit).
Bit patterns (for bitcast_convert) are those of ml_dtypes.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from mesh import dtypes


def is_emulated(name: str) -> bool:
    return name in dtypes.STORAGE_TYPES


def round_to_format(x: jnp.ndarray, name: str) -> jnp.ndarray:
    """Real `x` (any float or integer dtype) rounded to format `name`, in its storage dtype.

    The grid step at |x| in [2**e, 2**(e+1)) is 2**(max(e, emin) - mantissa bits); scaling
    by it and rounding half to even is exact in x's own precision (FP32, or FP64 for FP64
    inputs, so an FP64 value is rounded once, not through FP32)."""
    info = ml_dtypes.finfo(dtypes.numpy_dtype(name))
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype not in (jnp.float32, jnp.float64):
        x = x.astype(jnp.float64 if x.dtype == jnp.int64 or x.dtype == jnp.uint64
                     else jnp.float32)
    magnitude = jnp.abs(x)
    _, exponent = jnp.frexp(magnitude)  # magnitude = m * 2**exponent, m in [0.5, 1)
    step = jnp.maximum(exponent - 1, info.minexp) - info.nmant
    rounded = jnp.ldexp(jnp.round(jnp.ldexp(magnitude, -step)), step)
    largest = np.asarray(info.max, x.dtype)
    rounded = jnp.where(jnp.isnan(x), 0, jnp.minimum(rounded, largest))
    negative = jnp.signbit(x) | jnp.isnan(x)
    signed = jnp.where(negative, -rounded, rounded)
    return signed.astype(dtypes.storage_dtype(name))


def to_bits(x: jnp.ndarray, name: str) -> jnp.ndarray:
    """The format's bit patterns (uint8) of values held in its storage dtype."""
    values = _values(name)
    positive = jnp.asarray(values[:len(values) // 2].astype(np.float32))
    wide = x.astype(jnp.float32)
    code = jnp.searchsorted(positive, jnp.abs(wide)).astype(jnp.uint8)  # values on the grid
    sign = jnp.where(jnp.signbit(wide), jnp.uint8(len(values) // 2), jnp.uint8(0))
    return code | sign


def from_bits(bits: jnp.ndarray, name: str) -> jnp.ndarray:
    """Values (in the storage dtype) of the format's bit patterns `bits` (unsigned ints;
    bits above the format's width are ignored)."""
    values = _values(name)
    table = jnp.asarray(values.astype(dtypes.storage_dtype(name)))
    return table[(bits & (len(values) - 1)).astype(jnp.int32)]


@functools.lru_cache(maxsize=None)
def _values(name: str) -> np.ndarray:
    """Every value of the format, indexed by its bit pattern (ml_dtypes' encoding)."""
    width = dtypes.bit_width(name)
    return np.arange(2 ** width, dtype=np.uint8).view(dtypes.numpy_dtype(name))


def host_to_storage(array):
    """A host array of an emulated format in the executor's storage dtype (exact); any
    other array as it is."""
    name = dtypes.numpy_name(array.dtype)
    return np.asarray(array).astype(dtypes.storage_dtype(name)) if is_emulated(name) else array


def storage_to_host(array, name: str):
    """A result held in the storage dtype as a host array of format `name` (exact)."""
    return np.asarray(array).astype(dtypes.numpy_dtype(name)) if is_emulated(name) else array

