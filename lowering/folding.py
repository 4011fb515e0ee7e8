"""Integer values known at lowering time on every chip, and folding arithmetic on them.

jax computes `axis_index` from `partition_id` with integer division and remainder. The
device id varies along every mesh axis, but `partition_id / 16 % 4` varies along x only.
Evaluating such arithmetic while lowering (each chip's value is known) gives the result the
layout it really has, so what is computed from it (a dynamic_slice of a weight at the chip's
position along x) is stored and computed once per x coordinate, not on all chips.
"""

from __future__ import annotations

import jax
import numpy as np

from lowering.host import host_devices
from lowering.walker import LoweringContext, Op
from mesh import dtypes, isa
from mesh.executor import run_program

# Largest value folded, in elements over all its per-chip copies: index arithmetic works on
# scalars; a large table stays an ordinary instruction.
FOLD_LIMIT = 4096


def remember(ctx: LoweringContext, value: int, array: np.ndarray) -> None:
    """Record `value` as known: `array` holds it in the executor layout (mesh dims, size 1
    where it is replicated, then the per-chip dims). Only small integer and bool values are
    kept: those are what index arithmetic folds."""
    if _foldable(ctx.type(value), array.size):
        ctx.builder.known[value] = array


def remember_source(ctx: LoweringContext, value: int, cls: type, /, **params) -> None:
    """Record the value an instruction without operands (a device id) defines, by running
    that instruction."""
    info = ctx.builder.values[value]
    if _foldable(info.type, int(np.prod(ctx.mesh.layout_shape(info.varying))) * info.type.size):
        remember(ctx, value, _evaluate(ctx, cls((-1,), (), **params), [], info.type,
                                       info.varying))


def fold(ctx: LoweringContext, op: Op, cls: type, /, **params) -> tuple[int, ...] | None:
    """Emit the op as a Constant when all its operands are known and its result is a small
    integer or bool; None (nothing emitted) otherwise."""
    (result_type,) = op.result_types
    known = [ctx.builder.known.get(v) for v in op.operands]
    varying = frozenset().union(*(ctx.varying(v) for v in op.operands))
    copies = int(np.prod(ctx.mesh.layout_shape(varying)))
    if not op.operands or any(k is None for k in known) or \
            not _foldable(result_type, copies * result_type.size):
        return None
    array = _evaluate(ctx, cls((-1,), tuple(op.operands), **params), known, result_type,
                      varying)
    layout = frozenset(a for a in varying if not (array == array.take([0], axis=a)).all())
    array = array[tuple(slice(None) if a in layout else slice(0, 1)
                        for a in range(ctx.mesh.rank))]
    # A replicated result is an ordinary constant, one per-chip value.
    value = array if layout else array.reshape(result_type.shape)
    (out,) = ctx.emit(isa.Constant, op, ins=(), varying=layout, value=value)
    remember(ctx, out, array)
    return (out,)


def _foldable(type_: isa.TensorType, elements: int) -> bool:
    return not dtypes.is_float(type_.dtype) and elements <= FOLD_LIMIT


# Integer and boolean elementwise ops whose NumPy function on operands of one dtype gives
# StableHLO's result bit for bit (two's-complement wrap-around; a boolean add is an or, a
# multiply an and). Division, remainder, shifts and powers differ at their edges (a
# division by zero, a shift by the width): the executor's kernel computes those.
_HOST_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
             "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
             "not": np.invert, "negate": np.negative, "maximum": np.maximum,
             "minimum": np.minimum, "select": np.where}
_HOST_COMPARISONS = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                     "GT": np.greater, "GE": np.greater_equal}


def _on_host(instr: isa.Instruction, args: list[np.ndarray], shape: tuple[int, ...],
             dtype: np.dtype) -> np.ndarray | None:
    """`instr` computed by NumPy where it gives the executor's result (an eager jax
    computation per fold costs more than the rest of a small program's lowering); None
    where it might not."""
    if not isinstance(instr, isa.Elementwise) or len({a.ndim for a in args}) != 1:
        return None  # (a scalar predicate of a select broadcasts from the left)
    if instr.op == "compare":
        function = _HOST_COMPARISONS.get(instr.direction) \
            if instr.compare_type != "TOTALORDER" else None
    else:
        function = _HOST_OPS.get(instr.op)
    operands = args[1:] if instr.op == "select" else args
    if function is None or len({a.dtype for a in operands}) != 1:
        return None
    try:
        with np.errstate(all="ignore"):  # (integers wrap around, as in XLA)
            result = np.asarray(function(*args))
    except TypeError:  # an op NumPy does not define on booleans (subtract, negate)
        return None
    if result.dtype != dtype:
        return None
    return np.broadcast_to(result, shape)


def _evaluate(ctx: LoweringContext, instr: isa.Instruction, args: list[np.ndarray],
              result_type: isa.TensorType, varying: frozenset[int]) -> np.ndarray:
    """Run one instruction on known values as the program would: with its executor
    kernel, or NumPy where that gives the same (_on_host)."""
    shape = ctx.mesh.layout_shape(varying) + result_type.shape
    result = _on_host(instr, args, shape, dtypes.storage_dtype(result_type.dtype))
    if result is not None:
        return result
    values = {v: ctx.builder.values[v] for v in instr.ins}
    values[-1] = isa.ValueInfo(result_type, varying)
    program = isa.Program(ctx.mesh, (instr,), tuple(dict.fromkeys(instr.ins)), (-1,), values)
    inputs = [args[instr.ins.index(v)] for v in program.inputs]
    # 64-bit integers keep their type, as in the executor. Computed on the simulator's own
    # CPU device (lowering.host), not jax's default one: with the trn2 plugin the default,
    # each op's eager computation would be a trn2 program of its own, lowered and compiled
    # by the plugin and then by its executor (about 40 ms each; jax caches them by shape)
    with jax.enable_x64(True), jax.default_device(host_devices(1)[0]):
        (result,) = run_program(program, inputs)
    return np.asarray(result)
