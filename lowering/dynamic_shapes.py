"""Dynamic shapes whose sizes are constants: refined to static shapes before lowering.

`dynamic_iota`, `dynamic_reshape`, `dynamic_broadcast_in_dim`, `dynamic_pad`,
`dynamic_gather`, `dynamic_conv`, `get_dimension_size` and values of dynamic type
(`tensor<?x4xf32>`) are static in practice: their shape operands are constants, or computed
from constants and static shapes. jaxlib's StableHLO shape refinement (the passes jax runs on
shape-polymorphic modules) propagates those constants and rewrites each such op to its static
form. What remains dynamic after it (a shape computed from an argument) is reported by the
walker as an op whose shape is not known while lowering.
"""

from __future__ import annotations

from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import _jax
from jaxlib.mlir import ir

from lowering import mlir
from lowering.errors import LoweringError

# Ops whose result shape comes from an operand's value: operand index -> what it is.
SHAPE_OPERANDS = {
    "stablehlo.dynamic_iota": {0: "output_shape"},
    "stablehlo.dynamic_reshape": {1: "output_shape"},
    "stablehlo.dynamic_broadcast_in_dim": {1: "output_dimensions"},
    "stablehlo.dynamic_pad": {2: "edge_padding_low", 3: "edge_padding_high",
                              4: "interior_padding"},
    "stablehlo.dynamic_gather": {2: "slice_sizes"},
    "stablehlo.dynamic_conv": {2: "padding"},
    "stablehlo.real_dynamic_slice": {1: "start_indices", 2: "limit_indices", 3: "strides"},
}
_DYNAMIC_OPS = frozenset(SHAPE_OPERANDS) | {"stablehlo.get_dimension_size"}


def needs_refinement(module: ir.Module) -> bool:
    """Whether the module has a dynamically shaped value or an op with shape operands."""
    def dynamic(operation) -> bool:
        if operation.name in _DYNAMIC_OPS:
            return True
        values = list(operation.results) + [a for r in operation.regions for b in r.blocks
                                            for a in b.arguments]
        if any(_is_dynamic(v.type) for v in values):
            return True
        return any(dynamic(inner.operation) for r in operation.regions for b in r.blocks
                   for inner in b.operations)

    return any(dynamic(op.operation) for op in module.body.operations)


def refine(module: ir.Module) -> ir.Module:
    """The module with every shape that constants determine made static."""
    try:
        refined = _jax.mlir.refine_polymorphic_shapes(
            mlir_module=jax_mlir.module_to_bytecode(module), enable_shape_assertions=True,
            validate_static_shapes=False, enable_shardy=True)
    except Exception as e:  # jaxlib reports a failed refinement as a plain error
        raise LoweringError(f"the module's dynamic shapes could not be made static: "
                            f"{e}") from None
    return mlir.parse(refined)


def _is_dynamic(t: ir.Type) -> bool:
    return str(t).startswith("tensor<") and not ir.ShapedType(t).has_static_shape
