"""Why a collective is in a per-chip program: the ones XLA's SPMD partitioner inserted.

In a program jax-trn2 had XLA partition (lowering.partition), a collective the user wrote
(psum, all_gather, ... in a shard_map) keeps jax's name for it in its location; any other
collective was inserted by the partitioner, at the location of the op that needed it (the
dot whose operand it gathers, the reduction whose partial sums it adds). Each inserted
collective gets a `why`: its kind, the mesh axes, the sharding change (`w1: P('fsdp', None)
-> P(None, None)`, when its operand is a piece of an argument) and the op it serves.
"""

from __future__ import annotations

import dataclasses
import re

from mesh import isa
from mesh.isa.sites import line_text

# jax primitives whose lowering is a collective: what a user writes (jax.lax.psum, ...).
USER_COLLECTIVES = frozenset({
    "psum", "psum_invariant", "pmax", "pmin", "ppermute", "pshuffle", "all_gather",
    "all_gather_invariant", "all_to_all", "ragged_all_to_all", "reduce_scatter",
    "psum_scatter", "pbroadcast", "pvary", "pcast",
})

COLLECTIVE_OPS = frozenset({
    "stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.reduce_scatter",
    "stablehlo.all_to_all", "stablehlo.collective_permute", "stablehlo.collective_broadcast",
})

_KIND = {isa.AllReduce: "all-reduce", isa.AllGather: "all-gather",
         isa.ReduceScatter: "reduce-scatter", isa.AllToAll: "all-to-all",
         isa.CollectivePermute: "collective-permute"}

# Instructions that pass a piece of an argument on unchanged in content (for naming it).
_PASS_THROUGH = (isa.Reshape, isa.Transpose)


def primitive(scope: str) -> str:
    """The jax primitive at the end of a name stack: `jit(f)/transpose(jvp(dot_general))`
    -> `dot_general`."""
    names = re.findall(r"[A-Za-z_][\w.]*", scope.rsplit("/", 1)[-1])
    return names[-1] if names else ""


def explain(builder, first: int, op, argument_names: dict[int, str]) -> None:
    """Give the collectives emitted for the collective `op` (builder.instructions[first:])
    a `why`, when the partitioner inserted it."""
    served = primitive(op.scope)
    if op.name not in COLLECTIVE_OPS or served in USER_COLLECTIVES:
        return
    for i in range(first, len(builder.instructions)):
        instr = builder.instructions[i]
        if type(instr) in _KIND and not instr.why:
            builder.instructions[i] = dataclasses.replace(
                instr, why=_why(builder, instr, served, op.loc, argument_names))


def _why(builder, instr: isa.Instruction, served: str, loc: str,
         argument_names: dict[int, str]) -> str:
    mesh = builder.mesh
    axes = getattr(instr, "groups", None)
    axes = axes.axes if axes is not None else None
    over = f" over {', '.join(mesh.axis_names[a] for a in axes)}" if axes else ""
    where = f" for the {served or 'op'}" + (f" at {line_text(loc)}" if loc else "")
    change = _sharding_change(builder, instr, axes, argument_names)
    return f"inserted by XLA's SPMD partitioner: {_KIND[type(instr)]}{change}{over}{where}"


def _sharding_change(builder, instr, axes, argument_names) -> str:
    """` of w1: P('fsdp', None) -> P(None, None)` when the operand is a piece of a named
    argument and the collective's effect on its sharding is known; else ''."""
    if not isinstance(instr, (isa.AllGather, isa.AllToAll)) or axes is None:
        return ""
    shard = _argument_piece(builder, instr.ins[0])
    if shard is None or shard.ins[0] not in argument_names:
        return ""
    before = list(shard.dim_axes)
    after = [tuple(a for a in dim if a not in axes) for dim in before]
    if isinstance(instr, isa.AllToAll):
        after[instr.split_dimension] = before[instr.split_dimension] + tuple(axes)
    names = builder.mesh.axis_names
    return (f" of {argument_names[shard.ins[0]]}: {_spec(before, names)} -> "
            f"{_spec(after, names)}")


def _argument_piece(builder, value: int) -> isa.Shard | None:
    """The Shard of a main argument that `value` is (through reshapes and transposes of
    the same shape), or None."""
    producers = {v: instr for instr in builder.instructions for v in instr.outs}
    instr = producers.get(value)
    while isinstance(instr, _PASS_THROUGH) and \
            builder.values[instr.outs[0]].type.shape == builder.values[instr.ins[0]].type.shape:
        instr = producers.get(instr.ins[0])
    return instr if isinstance(instr, isa.Shard) else None


def _spec(dim_axes, names) -> str:
    """jax's PartitionSpec spelling of dim_axes: P('fsdp', None), P(('data', 'fsdp'),)."""
    parts = []
    for axes in dim_axes:
        if not axes:
            parts.append("None")
        elif len(axes) == 1:
            parts.append(repr(names[axes[0]]))
        else:
            parts.append("(" + ", ".join(repr(names[a]) for a in axes) + ")")
    return f"P({', '.join(parts)})"
