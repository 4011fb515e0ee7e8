"""How an array's elements lie in a device's memory: its layout, the order of its dims from
the one whose index changes slowest in memory to the fastest (`major_to_minor`, jax's
spelling; row-major: 0, 1, ..., rank - 1). XLA spells the same order minor to major, as
text: `{1,0}` is row-major for two dims.

The simulator computes on logical values (numpy arrays in index order), whatever their
layout: a layout orders a buffer's bytes where they leave or enter it (`in_memory`).
Tiled layouts (TPU's) are refused: the simulated chips' buffers have no tiles.

Plain Python and numpy: jax_trn2's plugin imports it while jax starts its backends.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

Layout = tuple[int, ...]  # major_to_minor

_XLA_LAYOUT = re.compile(r"\{([0-9,\s]*)\}")


def row_major(rank: int) -> Layout:
    """The default layout of `rank` dims: the first dim most major."""
    return tuple(range(rank))


def parse(text: str, rank: int) -> Layout:
    """A layout from XLA's text (`{1,0}`: minor to major), for an array of `rank` dims;
    ValueError naming what is wrong, NotImplementedError for a tiled one."""
    match = _XLA_LAYOUT.fullmatch(text.strip())
    if match is None:
        if ":" in text:
            raise NotImplementedError(
                f"the layout {text} has tiles or an element size: the trn2 simulator's "
                "buffers have neither (give a Layout with major_to_minor alone)")
        raise ValueError(f"{text!r} is not an XLA layout such as {{1,0}}")
    minor_to_major = tuple(int(d) for d in match.group(1).split(",") if d.strip())
    return checked(minor_to_major[::-1], rank)


def checked(major_to_minor: Sequence[int], rank: int) -> Layout:
    """`major_to_minor` as a Layout, if it orders each of `rank` dims once; ValueError
    otherwise."""
    layout = tuple(int(d) for d in major_to_minor)
    if sorted(layout) != list(range(rank)):
        raise ValueError(f"the layout major_to_minor={layout} does not order the {rank} dims "
                         f"of the array (each of 0..{rank - 1} once)")
    return layout


def text(layout: Layout) -> str:
    """XLA's text of a layout (`{1,0}`), which jaxlib parses (PjRtLayout)."""
    return "{" + ",".join(str(d) for d in layout[::-1]) + "}"


def in_memory(array: np.ndarray, layout: Layout) -> np.ndarray:
    """`array`'s elements in the order `layout` puts them in memory, as a C-contiguous
    array (the array itself when it is row-major and contiguous)."""
    if layout == row_major(array.ndim):
        return np.require(array, requirements="C")  # (np.ascontiguousarray makes 0-d 1-d)
    return np.ascontiguousarray(array.transpose(layout))
