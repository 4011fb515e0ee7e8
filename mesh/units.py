"""Plain-text quantities for listings and summaries: seconds, bytes, rates."""

from __future__ import annotations


def seconds_text(seconds: float) -> str:
    """`12.345 us`: microseconds, the scale of one instruction on the mesh."""
    return f"{seconds * 1e6:,.3f} us"


def bytes_text(n: float) -> str:
    """`1.50 MiB`, binary units."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{n:,.0f} B"


def bandwidth_text(bytes_per_second: float) -> str:
    """`128 GB/s`, decimal units as link and HBM bandwidths are quoted."""
    return f"{bytes_per_second / 1e9:,.4g} GB/s"
