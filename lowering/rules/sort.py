"""sort, top_k and approx_max_k.

jax builds every sort's comparator the same way (lax.sort: lexicographic over the first
num_keys operands, floats in total order after -0.0 -> +0.0 and NaN -> one NaN). A sort whose
comparator is exactly the one lax.sort builds for its operand types and some num_keys runs
as lax.sort; any other comparator is run as a scalar program.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax import lax

from lowering.registry import custom_call_rule, rule
from lowering.walker import LoweringContext, Op, ProgramBuilder, Region, Walker
from mesh import dtypes, isa


@rule("stablehlo.sort")
def sort(ctx: LoweringContext, op: Op):
    comparator = ctx.scalar_program(op.regions[0], "comparator")
    types = tuple(t.dtype for t in op.operand_types)
    num_keys = next((k for k in range(1, len(types) + 1)
                     if same_computation(comparator, lax_comparator(types, k))), None)
    rank = op.operand_types[0].rank
    dimension = op.attr("dimension", -1)
    return ctx.emit(isa.Sort, op, dimension=dimension + rank if dimension < 0 else dimension,
                    is_stable=op.attr("is_stable", False), num_keys=num_keys,
                    comparator=None if num_keys else comparator)


@rule("chlo.top_k", "mhlo.topk")
def top_k(ctx: LoweringContext, op: Op):
    """chlo.top_k; mhlo.topk is how it reads in a module XLA partitioned (converted back from
    HLO), whose `largest = false` (the k smallest) jax never emits."""
    if not op.attr("largest", True):
        raise NotImplementedError("mhlo.topk with largest = false (the k smallest elements) "
                                  "is not supported by jax-trn2")
    return ctx.emit(isa.TopK, op, k=op.attrs["k"])


@custom_call_rule("ApproxTopK")
def approx_top_k(ctx: LoweringContext, op: Op):
    """lax.approx_max_k and approx_min_k as jax lowers them for platforms other than the
    TPU (`is_fallback`): the values, their int32 indices along reduction_dim (an iota)
    and jax's init values, with jax's comparator (the values compared GT, or LT). It runs
    as XLA computes that fallback (an exact top-k of as many as the results have: a sort,
    or a reduce for one element), ties and NaNs included."""
    config = op.backend_config
    if not config.get("is_fallback", False):
        raise NotImplementedError(
            "ApproxTopK without is_fallback (jax's lowering for the TPU, whose partial "
            "reduction XLA computes only there) is not supported by jax-trn2")
    dimension = config["reduction_dim"]
    (comparator,) = op.attrs["called_computations"]
    direction = _compared_values(ctx.walker.functions[comparator])
    if len(op.operands) != 4 or direction is None or \
            not _is_iota(ctx, op.operands[1], dimension):
        raise NotImplementedError(
            "ApproxTopK other than jax's (one operand, its iota indices, a comparator of "
            f"the values alone: @{comparator} is not) is not supported by jax-trn2")
    # XLA's fallback keeps as many as the results have along the dim: the user's k, or
    # without aggregate_to_topk the size the TPU's approximation would keep
    return ctx.emit(isa.ApproxTopK, op, ins=op.operands[:1],
                    k=op.result_types[0].shape[dimension], dimension=dimension,
                    largest=direction == "GT")


def _compared_values(function) -> str | None:
    """The direction of jax's approx_top_k comparator (GT or LT on its first two
    arguments, nothing else), None for any other function."""
    block = function.regions[0].blocks[0]
    ops = list(block.operations)
    if len(ops) != 2 or ops[0].operation.name != "stablehlo.compare":
        return None
    compare = ops[0].operation
    if list(compare.operands) != list(block.arguments)[:2] or \
            list(ops[1].operation.operands) != list(compare.results):
        return None
    direction = str(compare.attributes["comparison_direction"])
    return next((d for d in ("GT", "LT") if d in direction), None)


def _is_iota(ctx: LoweringContext, value: int, dimension: int) -> bool:
    producer = next((i for i in reversed(ctx.builder.instructions) if value in i.outs), None)
    return isinstance(producer, isa.Iota) and producer.dimension == dimension


@functools.lru_cache(maxsize=None)
def lax_comparator(types: tuple[str, ...], num_keys: int) -> isa.Program:
    """The comparator lax.sort builds for operands of these element types, lowered as the
    comparator of a sort in a program is."""
    with jax.enable_x64(True):  # 64-bit operand types keep their type
        operands = [jax.ShapeDtypeStruct((2,), dtypes.numpy_dtype(t)) for t in types]
        module = jax.jit(lambda *xs: lax.sort(xs, num_keys=num_keys)).lower(
            *operands).compiler_ir("stablehlo")
    walker = Walker(module)
    sort_op = next(op for op in walker.function_block("main").operations
                   if op.operation.name == "stablehlo.sort")
    context = LoweringContext(walker, ProgramBuilder(walker.mesh))
    return context.scalar_program(Region(sort_op.operation.regions[0]), "comparator")


def same_computation(a: isa.Program, b: isa.Program) -> bool:
    """Whether two programs do the same instructions in the same order on the same inputs
    and constants (value ids, source locations and where constants are made aside: a
    module serialized for a PJRT plugin has a comparator's constants hoisted out of it)."""
    if len(a.inputs) != len(b.inputs) or \
            any(a.info(x).type != b.info(y).type for x, y in zip(a.inputs, b.inputs)):
        return False
    a_steps, a_constants = _split_constants(a)
    b_steps, b_constants = _split_constants(b)
    if len(a_steps) != len(b_steps):
        return False
    renamed = dict(zip(a.inputs, b.inputs))

    def same(x: int, y: int) -> bool:
        if x in a_constants or y in b_constants:
            return x in a_constants and y in b_constants and a_constants[x] == b_constants[y]
        return renamed.get(x) == y

    for x, y in zip(a_steps, b_steps):
        if type(x) is not type(y) or len(x.outs) != len(y.outs) or \
                len(x.ins) != len(y.ins) or not all(map(same, x.ins, y.ins)) or \
                not _same_params(x.params(), y.params()):
            return False
        renamed.update(zip(x.outs, y.outs))
    return len(a.outputs) == len(b.outputs) and all(map(same, a.outputs, b.outputs))


def _split_constants(program: isa.Program) -> tuple[list, dict[int, tuple]]:
    """A program's instructions other than constants, and each constant's value (its
    dtype, shape and bytes) by the value id it defines."""
    constants = {instr.outs[0]: (instr.value.dtype, instr.value.shape, instr.value.tobytes())
                 for instr in program.instructions if isinstance(instr, isa.Constant)}
    return [i for i in program.instructions if not isinstance(i, isa.Constant)], constants


def _same_params(p: dict, q: dict) -> bool:
    if p.keys() != q.keys():
        return False
    for key, x in p.items():
        y = q[key]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            x, y = np.asarray(x), np.asarray(y)
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
        elif x != y:
            return False
    return True
