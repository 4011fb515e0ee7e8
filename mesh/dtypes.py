"""Element types of the simulated machine, by their numpy names.

Low-precision floats and sub-byte integers come from ml_dtypes. Trainium2 computes with FP32,
BF16, FP16, the FP8 formats E4M3, E5M2 and E3M4 ("cFP8"), INT8, and the integer and boolean
types StableHLO uses for indices and masks. The other element types StableHLO has (the FNUZ
and E8M0 FP8 formats, the MX formats FP4 E2M1 and FP6 E2M3/E3M2, 2- and 4-bit integers) are
computed as a compiler for the chip would: widened to a type the engines have, computed
there and rounded (or wrapped) back to their own width, so results are those of the type.

The executor holds each value in its own dtype, except where the host's XLA cannot (the FP6
formats): those are held in a wider float that represents every value of the type exactly
(`storage_dtype`), and are rounded to the type's own grid (mesh.emulated_floats).
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "complex64": np.dtype(np.complex64),  # pairs of FP32 (Trainium2 has no complex type:
    "complex128": np.dtype(np.complex128),  # computed on the parts, see mesh.isa.kernels)
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
    "float8_e3m4": np.dtype(ml_dtypes.float8_e3m4),
    "float8_e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "float8_e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "float8_e4m3b11fnuz": np.dtype(ml_dtypes.float8_e4m3b11fnuz),
    "float8_e8m0fnu": np.dtype(ml_dtypes.float8_e8m0fnu),
    "float6_e2m3fn": np.dtype(ml_dtypes.float6_e2m3fn),
    "float6_e3m2fn": np.dtype(ml_dtypes.float6_e3m2fn),
    "float4_e2m1fn": np.dtype(ml_dtypes.float4_e2m1fn),
    "bool": np.dtype(np.bool_),
    "int2": np.dtype(ml_dtypes.int2),
    "int4": np.dtype(ml_dtypes.int4),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint2": np.dtype(ml_dtypes.uint2),
    "uint4": np.dtype(ml_dtypes.uint4),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
}

FP8_TYPES = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4"})
# Narrow floats that are not Trainium2 types (computed like them, in FP32).
OTHER_NARROW_FLOATS = frozenset({
    "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz", "float8_e8m0fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"})
# Floats narrower than FP32: the engines compute on them in FP32 and round once.
LOW_PRECISION_FLOATS = frozenset({"bfloat16", "float16"}) | FP8_TYPES | OTHER_NARROW_FLOATS

# Types the host's XLA cannot hold -> the type the executor holds their values in: one
# whose values include every value of the type (FP6 E2M3 in E4M3FN, FP6 E3M2 in E5M2).
STORAGE_TYPES = {"float6_e2m3fn": "float8_e4m3fn", "float6_e3m2fn": "float8_e5m2"}


# Complex types -> the real type of their parts (what the engines compute on).
COMPLEX_PARTS = {"complex64": "float32", "complex128": "float64"}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of an element type name; ValueError names the unknown type."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"element type {name!r} is not supported by jax-trn2; "
                         f"supported: {', '.join(DTYPES)}") from None


def dtype_name(dtype) -> str:
    """The element type name of a numpy or jax dtype."""
    name = numpy_name(dtype)
    numpy_dtype(name)
    return name


@functools.lru_cache(maxsize=256)
def numpy_name(dtype) -> str:
    """np.dtype(dtype).name, remembered: numpy makes a dtype's name in Python, taking
    microseconds on every argument of every run."""
    return np.dtype(dtype).name


def is_float(name: str) -> bool:
    return np.issubdtype(numpy_dtype(name), np.floating) or name in LOW_PRECISION_FLOATS


def itemsize(name: str) -> int:
    """Bytes per element (as stored: sub-byte types take a byte each)."""
    return numpy_dtype(name).itemsize


# Types narrower than the byte each element is stored in: their width in bits.
SUB_BYTE_BITS = {"bool": 1, "int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4,
                 "float6_e2m3fn": 6, "float6_e3m2fn": 6}


def bit_width(name: str) -> int:
    """Bits of one element of the type (1 for bool, 4 for int4), as bitcast_convert sees it."""
    return SUB_BYTE_BITS.get(name) or 8 * itemsize(name)


def storage_name(name: str) -> str:
    """The type the executor holds values of type `name` in (`name` itself, but for the
    STORAGE_TYPES the host cannot compute with)."""
    return STORAGE_TYPES.get(name, name)


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype of `storage_name(name)`."""
    return numpy_dtype(storage_name(name))
