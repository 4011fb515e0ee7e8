"""A program's content as a dictionary key: programs that compute the same thing (the same
instructions with the same parameters, source locations and plans, the same values and
constants) have equal keys, whichever compile made them.

jax compiles a program again where only what the simulator does not see differs (a
function called with keyword arguments rather than positional ones, an argument committed
to the device it would have been on anyway): its StableHLO differs in the caller's source
line or an empty sharding, the Trn2 program it lowers to does not.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
from typing import Any, Hashable

import numpy as np

from mesh import isa


def program_key(program: isa.Program) -> tuple[str, tuple[Hashable, ...]]:
    """`(digest, objects)`: a SHA-256 of everything `program` holds, and in order the objects
    it holds that have no content to hash (a host callback's Python function), which the
    key holds as themselves (equal where they compare equal: the same function)."""
    content = bytearray()  # hashed at once: a hash update per part costs more than the part
    objects: list[Hashable] = []
    _add(content, objects, program)
    return hashlib.sha256(content).hexdigest(), tuple(objects)


_SCALARS = (bool, int, float, complex, str, np.generic, np.dtype, enum.Enum, type)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(field.name for field in dataclasses.fields(cls))


def _add(content: bytearray, objects: list[Hashable], value: Any) -> None:
    """Append `value` to `content`, tagged with its type so that different structures never
    give the same bytes."""
    if value is None or isinstance(value, _SCALARS):
        _write(content, type(value).__qualname__, repr(value))
    elif isinstance(value, bytes):
        _write(content, "bytes", value)
    elif isinstance(value, np.ndarray):
        _write(content, "ndarray", value.dtype.str, repr(value.shape),
               np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (tuple, list)):
        _write(content, type(value).__qualname__, str(len(value)))
        for item in value:
            _add(content, objects, item)
    elif isinstance(value, (frozenset, set)):  # in a fixed order: its items sorted
        _add(content, objects, sorted(value, key=repr))
    elif isinstance(value, dict):
        _add(content, objects, sorted(value.items(), key=lambda item: repr(item[0])))
    elif dataclasses.is_dataclass(value):  # instructions, programs, types, plans
        names = _field_names(type(value))
        _write(content, type(value).__module__, type(value).__qualname__, str(len(names)))
        for name in names:
            _add(content, objects, getattr(value, name))
    else:
        _write(content, "object", str(len(objects)))
        objects.append(value)


def _write(content: bytearray, *parts: str | bytes) -> None:
    """Each part with its length first, so that no two sequences of parts give the same
    bytes."""
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        content += len(data).to_bytes(8, "little")
        content += data
