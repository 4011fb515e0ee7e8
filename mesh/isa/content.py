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
import hashlib
from typing import Any, Hashable

import numpy as np

from mesh import isa


def program_key(program: isa.Program) -> tuple[str, tuple[Hashable, ...]]:
    """`(digest, objects)`: a SHA-256 of everything `program` holds, and in order the objects
    it holds that have no content to hash (a host callback's Python function), which the
    key holds as themselves (equal where they compare equal: the same function)."""
    digest = hashlib.sha256()
    objects: list[Hashable] = []
    _add(digest, objects, program)
    return digest.hexdigest(), tuple(objects)


def _add(digest: Any, objects: list[Hashable], value: Any) -> None:
    """Feed `value` to `digest`, tagged with its type so that different structures never
    feed the same bytes."""
    if value is None or isinstance(value, (bool, int, float, complex, str, np.generic,
                                           np.dtype, enum.Enum, type)):
        _write(digest, type(value).__qualname__, repr(value))
    elif isinstance(value, bytes):
        _write(digest, "bytes", value)
    elif isinstance(value, np.ndarray):
        _write(digest, "ndarray", value.dtype.str, repr(value.shape),
               np.ascontiguousarray(value).tobytes())
    elif isinstance(value, (tuple, list)):
        _write(digest, type(value).__qualname__, str(len(value)))
        for item in value:
            _add(digest, objects, item)
    elif isinstance(value, (frozenset, set)):  # in a fixed order: its items sorted
        _add(digest, objects, sorted(value, key=repr))
    elif isinstance(value, dict):
        _add(digest, objects, sorted(value.items(), key=lambda item: repr(item[0])))
    elif dataclasses.is_dataclass(value):  # instructions, programs, types, plans
        fields = dataclasses.fields(value)
        _write(digest, type(value).__module__, type(value).__qualname__, str(len(fields)))
        for field in fields:
            _add(digest, objects, getattr(value, field.name))
    else:
        _write(digest, "object", str(len(objects)))
        objects.append(value)


def _write(digest: Any, *parts: str | bytes) -> None:
    """Each part with its length first, so that no two sequences of parts feed the same
    bytes."""
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little") + data)
