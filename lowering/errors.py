"""Errors that name the op, its source line and the shapes involved."""

from __future__ import annotations


class LoweringError(ValueError):
    """A StableHLO op could not be lowered to a Trn2 program."""


class UnsupportedOpError(LoweringError, NotImplementedError):
    """An op (or a form of it) that jax-trn2 has no rule for."""


def located(message: str, op_name: str, location: str, source: str = "") -> str:
    """`message`, followed by where: `op at file:line` and the source line itself."""
    where = f"\n  at {location}" if location else "\n  at an unknown source location"
    line = f"\n    {source}" if source else ""
    return f"{message} ({op_name}){where}{line}"


def unreduced_values(sharding: str) -> NotImplementedError:
    """The error for a sharding with unreduced axes (jax's `P(unreduced={...})`, and the
    gradients of `P(reduced={...})` values: each device along those axes holds a different
    partial sum of the value) where jax-trn2 has no place for them."""
    return NotImplementedError(
        f"sharding {sharding}: jax-trn2 takes unreduced values (a different partial sum on "
        "each device along the unreduced axes) only as the arguments and results of a "
        "program XLA's SPMD partitioner partitions (jax.jit with Shardy, jax's default), "
        "not here")
