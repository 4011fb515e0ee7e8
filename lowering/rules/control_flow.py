"""Control flow: stablehlo.while, stablehlo.if and stablehlo.case over sub-programs.

The regions become sub-programs on the enclosing mesh (mesh.isa.control). A loop-carried
value's layout must be the same on every iteration, so the loop's layouts are a fixed point:
a value replicated on entry that the body makes vary (a ppermute, a partition_id) is widened
and the regions are lowered again until nothing changes. Where the loop condition or the
branch index differs from chip to chip, the carried values and results vary along its axes
too, since chips then go different ways.
"""

from __future__ import annotations

import numpy as np

from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import dtypes, isa
from mesh.isa.control import Case, Scan, While


@rule("stablehlo.while")
def while_(ctx: LoweringContext, op: Op):
    cond_region, body_region = op.regions
    layouts = [ctx.varying(v) for v in op.operands]
    while True:  # layouts only grow, so this ends (within a few rounds in practice)
        (cond, body), captured = ctx.sub_programs((cond_region, body_region), layouts,
                                                  ("cond", "body"))
        condition = cond.info(cond.outputs[0]).varying
        widened = [layout | body.info(out).varying | condition
                   for layout, out in zip(layouts, body.outputs)]
        if widened == layouts:
            break
        layouts = widened
    trip_count = static_trip_count(cond, body, [ctx.constant_value(v) for v in op.operands],
                                   [ctx.constant_value(v) for v in captured])
    return ctx.emit(While, op, ins=op.operands + captured, out_layouts=layouts, cond=cond,
                    body=body, trip_count=trip_count)


@rule("chlo.scan")
def scan(ctx: LoweringContext, op: Op):
    """chlo.scan as a loop over the positions along `dimension`. Carries' layouts are a
    fixed point, as a while loop's."""
    num_inputs, num_carries = op.attrs["operandSegmentSizes"]
    num_outputs = op.attrs["resultSegmentSizes"][0]
    dimension = op.attrs["dimension"]
    inputs, inits = op.operands[:num_inputs], op.operands[num_inputs:]
    carries = [ctx.varying(v) for v in inits]
    while True:  # layouts only grow, so this ends
        (body,), captured = ctx.sub_programs(
            op.regions, [ctx.varying(v) for v in inputs] + carries, ("body",))
        widened = [layout | body.info(out).varying
                   for layout, out in zip(carries, body.outputs[num_outputs:])]
        if widened == carries:
            break
        carries = widened
    shaped = op.operand_types[0] if inputs else op.result_types[0]
    layouts = [body.info(out).varying for out in body.outputs[:num_outputs]] + carries
    return ctx.emit(Scan, op, ins=op.operands + captured, out_layouts=layouts,
                    dimension=dimension, is_reverse=op.attr("is_reverse", False),
                    num_inputs=num_inputs, num_carries=num_carries, body=body,
                    trip_count=shaped.shape[dimension])


@rule("stablehlo.if", "stablehlo.case")
def case(ctx: LoweringContext, op: Op):
    names = ("true", "false") if op.short_name == "if" else \
        tuple(f"branch{i}" for i in range(len(op.regions)))
    branches, captured = ctx.sub_programs(op.regions, (), names)
    index = op.operands[0]
    layouts = [ctx.varying(index).union(*(b.info(b.outputs[i]).varying for b in branches))
               for i in range(len(op.result_types))]
    return ctx.emit(Case, op, ins=(index,) + captured, out_layouts=layouts,
                    branches=tuple(branches))


# --- static trip counts --------------------------------------------------------------------

def static_trip_count(cond: isa.Program, body: isa.Program, inits: list[np.ndarray | None],
                      captured: list[np.ndarray | None]) -> int | None:
    """The number of iterations of a loop that counts an integer from a constant start by a
    constant step while it compares with a constant bound (what fori_loop and scan emit);
    None when the loop is not of that form or would not end. `inits` and `captured` are the
    constant values of the loop's operands and captured values (None where not constant)."""
    compare = _source(cond, cond.outputs[0], inits, captured)
    if not (isinstance(compare, isa.Elementwise) and compare.op == "compare"):
        return None
    lhs, rhs = (_source(cond, v, inits, captured) for v in compare.ins)
    direction = compare.direction
    if isinstance(lhs, np.ndarray) and isinstance(rhs, int):
        lhs, rhs, direction = rhs, lhs, _FLIPPED[direction]
    if not (isinstance(lhs, int) and isinstance(rhs, np.ndarray)):
        return None
    counter = lhs
    step = _step(body, counter, inits, captured)
    start = inits[counter]
    if step is None or start is None or not _is_int_scalar(start) or not _is_int_scalar(rhs):
        return None
    count = _count(start.item(), rhs.item(), step, direction)
    # The counter must not wrap around its type on the way (it would then go on counting).
    limits = np.iinfo(start.dtype)
    if count is None or not limits.min <= start.item() + count * step <= limits.max:
        return None
    return count


_FLIPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "EQ": "EQ", "NE": "NE"}


def _source(program: isa.Program, value: int, inits: list, captured: list):
    """What `value` is, looking through integer conversions and reshapes: the index of a
    loop-carried input (int), a constant (np.ndarray), or the instruction computing it."""
    defining = {out: instr for instr in program.instructions for out in instr.outs}
    while True:
        if value in program.inputs:
            k = program.inputs.index(value)
            return k if k < len(inits) else captured[k - len(inits)]
        instr = defining[value]
        if isinstance(instr, isa.Constant):
            return np.asarray(instr.value)
        passes_through = isinstance(instr, isa.Reshape) or (
            isinstance(instr, isa.Elementwise) and instr.op == "convert"
            and np.issubdtype(dtypes.numpy_dtype(program.info(value).type.dtype), np.integer))
        if not passes_through:
            return instr
        value = instr.ins[0]


def _step(body: isa.Program, counter: int, inits: list, captured: list) -> int | None:
    """The constant the body adds to loop-carried value `counter`, if it does only that."""
    update = _source(body, body.outputs[counter], inits, captured)
    if not (isinstance(update, isa.Elementwise) and update.op in ("add", "subtract")):
        return None
    a, b = (_source(body, v, inits, captured) for v in update.ins)
    if update.op == "add" and isinstance(a, np.ndarray):
        a, b = b, a
    if not (isinstance(a, int) and a == counter and _is_int_scalar(b)):
        return None
    return b.item() if update.op == "add" else -b.item()


def _is_int_scalar(x) -> bool:
    return isinstance(x, np.ndarray) and x.size == 1 and np.issubdtype(x.dtype, np.integer)


def _count(start: int, bound: int, step: int, direction: str) -> int | None:
    """Iterations of `i = start; while i <direction> bound: i += step`; None if endless."""
    holds = {"LT": start < bound, "LE": start <= bound, "GT": start > bound,
             "GE": start >= bound, "NE": start != bound, "EQ": start == bound}[direction]
    if not holds:
        return 0
    if direction == "EQ":
        return 1 if step else None
    if direction in ("LT", "LE") and step > 0:
        return -(-(bound - start + (direction == "LE")) // step)
    if direction in ("GT", "GE") and step < 0:
        return -(-(start - bound + (direction == "GE")) // -step)
    if direction == "NE" and step and (bound - start) % step == 0 and (bound - start) // step > 0:
        return (bound - start) // step
    return None
