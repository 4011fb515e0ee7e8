"""The level of LLVM optimization XLA:CPU compiles an executor's computation at.

XLA:CPU's default level (`xla_backend_optimization_level` 3) unrolls and vectorizes
hardest, and can take many times longer than level 2 for the same code: a threefry
random-bits program over 4 chips (jax.random.bits of [8, 12]) compiled in 780-840 ms at
level 3 and in about 100 ms at level 2 (a 2-core AMD EPYC). The two levels give the same
bits for integer ops and for float ops that round once, exactly, whatever code surrounds
them (add, subtract, divide, sqrt, conversions, comparisons, moves), but not for XLA's
float reductions, which LLVM vectorizes in other orders at each level, nor for products:
XLA:CPU lets LLVM contract a product and the sum it feeds into one fused multiply-add, as
the code around them allows (its approximations of transcendental functions are such sums
of products: measured over 465 programs, a row sum of 1000 FP32 elements, a softmax and
atan of a [7, 33] array each differ between the levels). So a computation is compiled at
level 2 where every op on floats is one of those exact ones, and at XLA's default level
otherwise.
"""

from __future__ import annotations

from jaxlib.mlir import ir

# The level for computations whose results do not depend on it (`compiler_options`).
EXACT_LEVEL = 2
_LEVEL_OPTION = "xla_backend_optimization_level"

# Ops whose results are the same at every level whatever their element types: moves,
# selections, comparisons, exact roundings, control flow, and calls of compiled kernels
# (custom calls: the native kernels' order of operations is their own).
_EXACT_OPS = frozenset({
    "func.func", "func.return", "func.call", "stablehlo.return", "stablehlo.while",
    "stablehlo.if", "stablehlo.case", "stablehlo.optimization_barrier", "stablehlo.tuple",
    "stablehlo.get_tuple_element", "stablehlo.custom_call", "stablehlo.constant",
    "stablehlo.iota", "stablehlo.broadcast_in_dim", "stablehlo.broadcast", "stablehlo.reshape",
    "stablehlo.transpose", "stablehlo.slice", "stablehlo.dynamic_slice",
    "stablehlo.dynamic_update_slice", "stablehlo.concatenate", "stablehlo.pad",
    "stablehlo.gather", "stablehlo.reverse", "stablehlo.select", "stablehlo.compare",
    "stablehlo.convert", "stablehlo.bitcast_convert", "stablehlo.reduce_precision",
    "stablehlo.sort", "stablehlo.real", "stablehlo.imag", "stablehlo.complex",
    "stablehlo.abs", "stablehlo.negate", "stablehlo.sign", "stablehlo.floor",
    "stablehlo.ceil", "stablehlo.round_nearest_even", "stablehlo.round_nearest_afz",
    "stablehlo.is_finite", "stablehlo.maximum", "stablehlo.minimum", "stablehlo.clamp",
})
# Arithmetic IEEE 754 rounds exactly, on real floats (XLA expands complex ones into
# several operations, the division with scaling). Not multiply: XLA:CPU lets LLVM contract
# a product and the sum it feeds into one fused multiply-add (one rounding, not two), which
# it does or not as the level shapes the code around them.
_EXACT_REAL_ARITHMETIC = frozenset({
    "stablehlo.add", "stablehlo.subtract", "stablehlo.divide", "stablehlo.sqrt",
})


def compiler_options(module: ir.Module) -> dict[str, int]:
    """XLA's options for compiling `module` (an executor's computation): level 2 where
    that cannot change its results (see the module's docstring), else none."""
    return {_LEVEL_OPTION: EXACT_LEVEL} if level_free(module) else {}


def level_free(module: ir.Module) -> bool:
    """Whether every op of `module` that computes on floats rounds exactly (so that LLVM's
    level of optimization cannot change its results)."""
    inexact = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        name = op.name
        if name in _EXACT_OPS or not _computes_on_floats(op, name):
            return ir.WalkResult.ADVANCE
        inexact.append(name)
        return ir.WalkResult.INTERRUPT

    module.operation.walk(visit)
    return not inexact


def _computes_on_floats(op: ir.Operation, name: str) -> bool:
    """Whether `op` takes or gives floats it could round otherwise than exactly: any float
    or complex value, but a real float's in exactly rounded arithmetic."""
    inexact_kinds = (ir.ComplexType,) if name in _EXACT_REAL_ARITHMETIC else \
        (ir.ComplexType, ir.FloatType)
    for value in (*op.operands, *op.results):
        t = value.type
        element = t.element_type if isinstance(t, ir.ShapedType) else t
        if isinstance(element, inexact_kinds):
            return True
    return False
