"""Plain-text quantities for listings and summaries: seconds, bytes, rates."""

from __future__ import annotations


def seconds_text(seconds: float) -> str:
    """`12.345 us`: microseconds, the scale of one instruction on the mesh."""
    return f"{seconds * 1e6:,.3f} us"


def byte_unit(n: float) -> tuple[float, str]:
    """(bytes in the unit, binary unit) that shows `n` bytes as 1 to 1024 units."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return float(size), unit
    return 1.0, "B"


def bytes_text(n: float) -> str:
    """`1.50 MiB`, binary units."""
    size, unit = byte_unit(n)
    return f"{n:,.0f} B" if unit == "B" else f"{n / size:,.2f} {unit}"


def bandwidth_text(bytes_per_second: float) -> str:
    """`128 GB/s`, decimal units as link and HBM bandwidths are quoted."""
    return f"{bytes_per_second / 1e9:,.4g} GB/s"
