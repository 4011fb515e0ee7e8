"""The layouts of a program's parameters and results (mesh.memory_layout: the order of an
array's elements in its buffer's memory), as jax asks for them (`mhlo.layout_mode` on
main's arguments and results) and as the compiler chooses them where jax leaves the choice
(`auto`): an auto parameter is row-major (as XLA:CPU chooses), and an auto result keeps the
memory order of the value it is computed from through transposes and elementwise ops (so
that a transpose moves no bytes, as XLA's layout assignment makes it a bitcast), else
row-major.

The program computes on logical values whatever their layouts (a LayoutConstraint custom
call is the identity on its value: rules/structure.py); the plugin orders a buffer's bytes
by them where they leave or enter it.
"""

from __future__ import annotations

from typing import Any, Sequence

from jaxlib.mlir import ir

from lowering import mlir
from mesh.memory_layout import Layout, checked, parse, row_major

LAYOUT_MODE_ATTR = "mhlo.layout_mode"
LAYOUT_CONSTRAINT = "LayoutConstraint"  # jax's custom call of with_sharding_constraint(Format)


def main_layouts(module: ir.Module) -> tuple[list[Layout], list[Layout]]:
    """The layouts of main's arguments and results: those jax gives (`mhlo.layout_mode`:
    `default` or absent, row-major; a concrete layout), and those it leaves to the compiler
    (`auto`: see the module docstring). A token's is that of the empty array jax passes
    for it."""
    from lowering.partition import main_function
    main = main_function(module)
    block = main.regions[0].blocks[0]
    attrs = mlir.Attributes(main)
    arguments = list(block.arguments)
    returned = list(block.operations[-1].operands)
    arg_modes = _modes(attrs.get("arg_attrs", ()), len(arguments))
    res_modes = _modes(attrs.get("res_attrs", ()), len(returned))
    arg_layouts = [_given(mode, _rank(a.type)) for a, mode in zip(arguments, arg_modes)]
    arg_layouts = [row_major(_rank(a.type)) if layout is None else layout
                   for a, layout in zip(arguments, arg_layouts)]
    known = _propagated(block, dict(zip(arguments, arg_layouts)))
    res_layouts = [_given(mode, _rank(v.type)) for v, mode in zip(returned, res_modes)]
    res_layouts = [known.get(v, row_major(_rank(v.type))) if layout is None else layout
                   for v, layout in zip(returned, res_layouts)]
    return arg_layouts, res_layouts


def _given(mode: str | None, rank: int) -> Layout | None:
    """The layout a `mhlo.layout_mode` names for an array of `rank` dims: row-major for
    `default` (or no mode), None for `auto` (the compiler's choice)."""
    if mode == "auto":
        return None
    return row_major(rank) if mode in (None, "default") else parse(mode, rank)


def _modes(entries: Sequence[Any], count: int) -> list[str | None]:
    modes = [entry.get(LAYOUT_MODE_ATTR) if isinstance(entry, dict) else None
             for entry in entries]
    return modes + [None] * (count - len(modes))


def _rank(value_type: ir.Type) -> int:
    """The rank of a tensor; a token's 1 (jax passes it as an empty array)."""
    return 1 if mlir.is_token(value_type) else ir.RankedTensorType(value_type).rank


def _propagated(block: Any, known: dict) -> dict:
    """`known` (value -> layout) extended through main's ops in order: a transpose's result
    keeps its operand's memory order (its dims permuted), an elementwise op's or a layout
    constraint's result keeps or takes its layout; other values are left out."""
    from lowering.rules.elementwise import OP_NAMES
    for op in block.operations:
        op = op.operation
        if len(op.results) != 1 or not op.operands:
            continue
        result, operand = op.results[0], op.operands[0]
        if op.name == "stablehlo.transpose" and operand in known:
            permutation = list(mlir.Attributes(op)["permutation"])
            position = {dim: i for i, dim in enumerate(permutation)}  # operand dim -> result
            known[result] = tuple(position[d] for d in known[operand])
        elif op.name == "stablehlo.custom_call" and \
                mlir.Attributes(op).get("call_target_name") == LAYOUT_CONSTRAINT:
            known[result] = constrained(op)
        elif op.name in OP_NAMES or op.name in _IDENTITIES:
            shape = _shape(result.type)
            laid_out = [v for v in op.operands if v in known and _shape(v.type) == shape]
            if laid_out:
                known[result] = known[laid_out[0]]
    return known


def _shape(value_type: ir.Type) -> tuple[int, ...] | None:
    """A ranked tensor's shape (None for other types)."""
    return tuple(ir.RankedTensorType(value_type).shape) \
        if isinstance(value_type, ir.RankedTensorType) else None


# Ops that give their operand's value unchanged (sharding annotations).
_IDENTITIES = frozenset({"sdy.sharding_constraint", "sdy.reshard"})


def constrained(op: Any) -> Layout:
    """The layout a LayoutConstraint custom call gives its result (its `result_layouts`,
    minor to major)."""
    rank = ir.RankedTensorType(op.results[0].type).rank
    # (read as the bindings give it: mlir.Attributes decodes no `index` elements)
    layouts = list(ir.ArrayAttr(op.attributes["result_layouts"])) \
        if "result_layouts" in op.attributes else []
    if len(layouts) != 1:
        raise ValueError("a LayoutConstraint custom call without one result layout")
    return checked([int(d) for d in ir.DenseIntElementsAttr(layouts[0])][::-1], rank)
