"""dot_general (and the older dot) and ragged_dot onto the Tensor Engine."""

from __future__ import annotations

import re

from lowering import mlir
from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import isa


@rule("stablehlo.dot_general")
def dot_general(ctx: LoweringContext, op: Op):
    dims = op.attrs["dot_dimension_numbers"]
    return ctx.emit(isa.Matmul, op, lhs_batch=dims.lhs_batch, rhs_batch=dims.rhs_batch,
                    lhs_contract=dims.lhs_contract, rhs_contract=dims.rhs_contract,
                    out_dtype=op.result_types[0].dtype)


@rule("stablehlo.dot")
def dot(ctx: LoweringContext, op: Op):
    """dot: vector/matrix products contracting lhs's last dim with rhs's first."""
    lhs_rank = op.operand_types[0].rank
    return ctx.emit(isa.Matmul, op, lhs_batch=(), rhs_batch=(), lhs_contract=(lhs_rank - 1,),
                    rhs_contract=(0,), out_dtype=op.result_types[0].dtype)


@rule("chlo.ragged_dot", "mhlo.ragged_dot")
def ragged_dot(ctx: LoweringContext, op: Op):
    """ragged_dot (jax.lax.ragged_dot: grouped matmuls of a mixture of experts) as one
    matmul per group (mhlo.ragged_dot: as XLA's SPMD partitioner leaves it). A ragged
    batch dim groups whole batch elements, each already a matmul of its own: that is
    dot_general (as XLA computes it on CPU)."""
    dims = _ragged_dot_dims(op.attrs["ragged_dot_dimension_numbers"])
    if len(dims.lhs_ragged) != 1:
        raise NotImplementedError(f"ragged_dot with lhs ragged dims {list(dims.lhs_ragged)} "
                                  "(exactly one is supported)")
    (ragged,) = dims.lhs_ragged
    out_dtype = op.result_types[0].dtype
    if ragged in dims.lhs_batch:
        return ctx.emit(isa.Matmul, op, ins=op.operands[:2], lhs_batch=dims.lhs_batch,
                        rhs_batch=dims.rhs_batch, lhs_contract=dims.lhs_contract,
                        rhs_contract=dims.rhs_contract, out_dtype=out_dtype)
    contracted = ragged in dims.lhs_contract
    if contracted == bool(dims.rhs_group):
        raise ValueError(f"ragged_dot with lhs ragged dim {ragged} and rhs group dims "
                         f"{list(dims.rhs_group)}: a ragged free dim needs one rhs group dim, "
                         "a ragged contraction dim none")
    return ctx.emit(isa.RaggedMatmul, op, lhs_batch=dims.lhs_batch, rhs_batch=dims.rhs_batch,
                    lhs_contract=dims.lhs_contract, rhs_contract=dims.rhs_contract,
                    lhs_ragged=ragged, rhs_group=None if contracted else dims.rhs_group[0],
                    out_dtype=out_dtype)


def _ragged_dot_dims(attr) -> mlir.RaggedDotDims:
    """chlo.ragged_dot's dimension numbers: the op's attribute; or, in a module serialized
    for a PJRT plugin (where the op is a composite), the composite's six lists of dims in
    the attribute's order (lhs batch, rhs batch, lhs contracting, rhs contracting, lhs
    ragged, rhs group: XLA's chlo-preserve-high-level-ops pass); or mhlo.ragged_dot's
    attribute, which the Python bindings give as its text
    (`#mhlo.ragged_dot<dot_dimension_numbers = #mhlo.dot<lhs_contracting_dimensions = [1],
    ...>, lhs_ragged_dimensions = [0], rhs_group_dimensions = [0]>`, empty lists left out)."""
    if isinstance(attr, mlir.RaggedDotDims):
        return attr
    if isinstance(attr, str):
        lists = dict(_DIMENSION_LIST.findall(attr))
        return mlir.RaggedDotDims(*(
            tuple(int(d) for d in lists.get(f"{name}_dimensions", "").split(",") if d.strip())
            for name in ("lhs_batching", "rhs_batching", "lhs_contracting",
                         "rhs_contracting", "lhs_ragged", "rhs_group")))
    return mlir.RaggedDotDims(*(tuple(int(d) for d in dims) for dims in attr))


_DIMENSION_LIST = re.compile(r"(\w+_dimensions) = \[([\d, ]*)\]")
