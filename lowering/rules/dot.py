"""dot_general (and the older dot) onto the Tensor Engine."""

from __future__ import annotations

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
