"""Element types of the simulated machine, by their numpy names.

Low-precision floats come from ml_dtypes. Trainium2 computes with FP32, BF16, FP16, the FP8
formats E4M3, E5M2 and E3M4 ("cFP8"), INT8, and the integer and boolean types StableHLO uses
for indices and masks.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
    "float8_e3m4": np.dtype(ml_dtypes.float8_e3m4),
    "bool": np.dtype(np.bool_),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
}

# Floats narrower than FP32: the engines compute on them in FP32 and round once.
LOW_PRECISION_FLOATS = frozenset(
    {"bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4"}
)
FP8_TYPES = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4"})


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of an element type name; ValueError names the unknown type."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"element type {name!r} is not supported by jax-trn2; "
                         f"supported: {', '.join(DTYPES)}") from None


def dtype_name(dtype) -> str:
    """The element type name of a numpy or jax dtype."""
    name = np.dtype(dtype).name
    numpy_dtype(name)
    return name


def is_float(name: str) -> bool:
    return np.issubdtype(numpy_dtype(name), np.floating) or name in LOW_PRECISION_FLOATS


def itemsize(name: str) -> int:
    """Bytes per element."""
    return numpy_dtype(name).itemsize
