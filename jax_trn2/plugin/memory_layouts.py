"""Buffers' layouts across PJRT: PJRT's layouts extension, and the byte order of copies.

A buffer holds its logical value (a numpy array in index order) and its layout, the order
of the value's elements in the buffer's memory (mesh.memory_layout: a major_to_minor tuple).
The layout shows where bytes cross PJRT: a copy to the host (Buffer_ToHostBuffer) writes
them in the order the caller's host layout asks for, the buffer's own when it gives none;
the pointer to a buffer's memory (Buffer_UnsafePointer) is to its bytes in its layout.

jaxlib asks for layouts through PJRT's layouts extension (pjrt_c_api_layouts_extension.h):
without it, it takes every buffer as row-major. Its layout objects are interned here, one
per layout, alive as long as the process: the C shim answers Buffer_MemoryLayout (a
buffer's Record points at its layout's), MemoryLayout_Serialize (XLA's text of it, `{1,0}`,
which jaxlib parses) and MemoryLayout_Destroy (nothing to free) without calling Python.
"""

from __future__ import annotations

import ctypes
from typing import Any

from jax_trn2.plugin import abi
from jax_trn2.plugin.abi import c
from mesh import memory_layout
from mesh.memory_layout import Layout


class LayoutRecord(ctypes.Structure):
    """What a PJRT_Layouts_MemoryLayout pointer points at (the C shim's trn2_layout): the
    layout's XLA text."""

    _fields_ = [("text", ctypes.c_char_p), ("size", ctypes.c_size_t)]


_INTERNED: dict[Layout, LayoutRecord] = {}


def pointer(layout: Layout) -> int:
    """The PJRT_Layouts_MemoryLayout of `layout`, made once."""
    record = _INTERNED.get(layout)
    if record is None:
        data = memory_layout.text(layout).encode()
        record = _INTERNED[layout] = LayoutRecord(data, len(data))
    return ctypes.addressof(record)


def read(address: int, rank: int) -> Layout:
    """A caller's PJRT_Buffer_MemoryLayout for an array of `rank` dims: a tiled layout
    without tiles (strides, or tiles, are refused: NotImplementedError)."""
    given = c.PJRT_Buffer_MemoryLayout.from_address(address)
    tiled = given._anon2.tiled
    if given.type != c.PJRT_Buffer_MemoryLayout_Type_Tiled or tiled.num_tiles:
        raise NotImplementedError("the trn2 plugin lays buffers out by a dim order alone "
                                  "(PJRT's tiled layout without tiles), not by strides or tiles")
    # (a scalar's minor_to_major is empty, its pointer NULL)
    minor_to_major = list((ctypes.c_int64 * tiled.minor_to_major_size).from_address(
        tiled.minor_to_major)) if tiled.minor_to_major_size else []
    return memory_layout.checked(minor_to_major[::-1], rank)


def extension(python_slots: dict[str, Any], shim: ctypes.CDLL,
              next_extension: Any = None) -> Any:
    """PJRT_Layouts_Extension: its slots the shim's and `python_slots` (by slot name, the
    table's: the client's default layout and an executable's); see abi.extension."""
    shim_slots = {f"PJRT_Layouts_{name}": getattr(shim, f"trn2_Layouts_{name}")
                  for name in ("MemoryLayout_Destroy", "MemoryLayout_Serialize",
                               "PJRT_Buffer_MemoryLayout")}
    return abi.extension("Layouts", shim_slots | python_slots, next_extension)
