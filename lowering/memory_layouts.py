"""The layouts of a program's parameters and results (mesh.memory_layout: the order of an
array's elements in its buffer's memory), as jax asks for them (`mhlo.layout_mode` on
main's arguments and results) and as the compiler chooses them where jax leaves the choice
(`auto`), as XLA:CPU chooses them: an auto parameter is row-major, and an auto result keeps
the memory order of the value it is computed from through transposes and elementwise ops
(so that a transpose moves no bytes, as XLA's layout assignment makes it a bitcast), else
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
# Ops that give their operand's value unchanged (sharding annotations).
_IDENTITIES = frozenset({"sdy.sharding_constraint", "sdy.reshard"})
# Ops XLA's simplifier folds a transpose of into themselves (they make the transposed value).
_TRANSPOSE_FOLDING = frozenset({"stablehlo.broadcast_in_dim", "stablehlo.iota",
                                "stablehlo.constant"})


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
    known = _propagated(block)
    arg_layouts = [_given(mode, rank, row_major(rank))
                   for mode, rank in zip(arg_modes, (_rank(a.type) for a in arguments))]
    res_layouts = [_given(mode, _rank(v.type), known.get(v, row_major(_rank(v.type))))
                   for v, mode in zip(returned, res_modes)]
    return arg_layouts, res_layouts


def _given(mode: str | None, rank: int, chosen: Layout) -> Layout:
    """The layout a `mhlo.layout_mode` names for an array of `rank` dims: row-major for
    `default` (or no mode), `chosen` for `auto` (the compiler's choice)."""
    if mode == "auto":
        return chosen
    return row_major(rank) if mode in (None, "default") else parse(mode, rank)


def _modes(entries: Sequence[Any], count: int) -> list[str | None]:
    modes = [entry.get(LAYOUT_MODE_ATTR) if isinstance(entry, dict) else None
             for entry in entries]
    return modes + [None] * (count - len(modes))


def _rank(value_type: ir.Type) -> int:
    """The rank of a tensor; a token's 1 (jax passes it as an empty array)."""
    return 1 if mlir.is_token(value_type) else ir.RankedTensorType(value_type).rank


def _propagated(block: Any) -> dict:
    """The layouts XLA:CPU's layout assignment gives main's values other than row-major
    (value -> layout): a transpose's result keeps its operand's memory order (its dims
    permuted: the transpose moves no bytes), an elementwise op's result its operand's, a
    layout constraint's result the constraint's. Every other value is row-major, main's
    arguments too whatever their layouts (XLA:CPU lays a parameter out in its default
    layout inside the program)."""
    from lowering.rules.elementwise import OP_NAMES
    known: dict = {}
    for op in block.operations:
        op = op.operation
        if len(op.results) != 1 or not op.operands:
            continue
        result, operand = op.results[0], op.operands[0]
        if op.name == "stablehlo.transpose" and not _folds_transposes(operand):
            permutation = list(mlir.Attributes(op)["permutation"])
            position = {dim: i for i, dim in enumerate(permutation)}  # operand dim -> result
            order = known.get(operand, row_major(len(permutation)))
            known[result] = tuple(position[d] for d in order)
        elif op.name == "stablehlo.custom_call" and \
                mlir.Attributes(op).get("call_target_name") == LAYOUT_CONSTRAINT:
            known[result] = _constrained(op)
        elif op.name in OP_NAMES or op.name in _IDENTITIES:
            shape = _shape(result.type)
            laid_out = [v for v in op.operands if v in known and _shape(v.type) == shape]
            if laid_out:
                known[result] = known[laid_out[0]]
    return known


def _folds_transposes(value: ir.Value) -> bool:
    """Whether XLA's simplifier folds a transpose of `value` into the op that makes it
    (a broadcast, iota or constant then makes the transposed value itself, row-major)."""
    owner = value.owner  # (a block, for a block's argument)
    return not isinstance(owner, ir.Block) and owner.name in _TRANSPOSE_FOLDING


def _shape(value_type: ir.Type) -> tuple[int, ...] | None:
    """A ranked tensor's shape (None for other types)."""
    return tuple(ir.RankedTensorType(value_type).shape) \
        if isinstance(value_type, ir.RankedTensorType) else None


def _constrained(op: Any) -> Layout:
    """The layout a LayoutConstraint custom call gives its result (its `result_layouts`,
    minor to major)."""
    rank = ir.RankedTensorType(op.results[0].type).rank
    # (read as the bindings give it: mlir.Attributes decodes no `index` elements)
    layouts = list(ir.ArrayAttr(op.attributes["result_layouts"])) \
        if "result_layouts" in op.attributes else []
    if len(layouts) != 1:
        raise ValueError("a LayoutConstraint custom call without one result layout")
    return checked([int(d) for d in ir.DenseIntElementsAttr(layouts[0])][::-1], rank)
