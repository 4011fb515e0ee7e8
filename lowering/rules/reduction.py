"""reduce: a known monoid when the body is one binary op, else the body as a sub-program."""

from __future__ import annotations

from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import isa


def monoid(body: isa.Program) -> str | None:
    """The combiner a body computes when it is `return op(acc, x)` for a known reduction."""
    if len(body.instructions) != 1 or len(body.inputs) != 2:
        return None
    (instr,) = body.instructions
    is_binary = isinstance(instr, isa.Elementwise) and instr.op in isa.REDUCTIONS
    if is_binary and set(instr.ins) == set(body.inputs) and body.outputs == instr.outs:
        return instr.op
    return None


@rule("stablehlo.reduce")
def reduce(ctx: LoweringContext, op: Op):
    n = len(op.operands) // 2
    if any(ctx.varying(init) for init in op.operands[n:]):
        raise NotImplementedError("a reduce whose init value differs from chip to chip")
    body = ctx.scalar_program(op.regions[0], "reducer")
    combiner = monoid(body)
    return ctx.emit(isa.Reduce, op, dimensions=tuple(op.attrs["dimensions"]),
                    combiner=combiner, body=None if combiner else body)
