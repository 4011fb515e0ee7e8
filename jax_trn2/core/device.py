"""PJRT-style Device and Buffer of the simulated machine."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_trn2.core.platform import DEVICE_KIND, PLUGIN_NAME
from mesh.emulated_floats import is_emulated



@dataclass(frozen=True)
class Device:
    """One simulated Trainium2 chip: its id and its coordinates on the torus."""

    id: int
    coords: tuple[int, ...]
    device_kind: str = DEVICE_KIND
    platform: str = PLUGIN_NAME

    def __repr__(self) -> str:
        return f"Trn2Device(id={self.id}, coords={self.coords})"


class Buffer:
    """An array resident on one simulated chip."""

    def __init__(self, array: Any, device: Device):
        # Types jax cannot hold on the host (FP6) stay numpy arrays.
        held = np.asarray(array) if is_emulated(np.dtype(getattr(array, "dtype", None)).name) \
            else None
        if held is None:
            # An array keeps its dtype (int64, float64 too); a Python scalar takes jax's default.
            keep_dtype = jax.enable_x64(True) if hasattr(array, "dtype") else nullcontext()
            with keep_dtype:
                held = jnp.asarray(array)
        self._array = held
        self.device = device

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        """Elements x the dtype's item size, as jax.Array.nbytes."""
        return self.size * np.dtype(self.dtype).itemsize

    def to_jax(self) -> jnp.ndarray:
        """The array (a numpy array for the types jax cannot hold, FP6)."""
        return self._array

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self._array, dtype=dtype)

    def __repr__(self) -> str:
        return f"Buffer({self._array.dtype}{list(self.shape)} on {self.device})"


