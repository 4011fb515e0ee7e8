"""gather and scatter: the forms jax emits for indexing, take_along_axis and .at[...]."""

from __future__ import annotations

from lowering.registry import rule
from lowering.rules.reduction import monoid
from lowering.walker import LoweringContext, Op
from mesh import isa


@rule("stablehlo.gather")
def gather(ctx: LoweringContext, op: Op):
    dims = op.attrs["dimension_numbers"]
    return ctx.emit(isa.Gather, op, offset_dims=dims.offset_dims,
                    collapsed_slice_dims=dims.collapsed_slice_dims,
                    operand_batching_dims=dims.operand_batching_dims,
                    start_indices_batching_dims=dims.start_indices_batching_dims,
                    start_index_map=dims.start_index_map,
                    index_vector_dim=dims.index_vector_dim,
                    slice_sizes=tuple(op.attrs["slice_sizes"]),
                    indices_are_sorted=op.attr("indices_are_sorted", False))


@rule("stablehlo.scatter")
def scatter(ctx: LoweringContext, op: Op):
    dims = op.attrs["scatter_dimension_numbers"]
    body = ctx.scalar_program(op.regions[0], "update")
    combiner = scatter_combiner(body) if len(op.operands) == 3 else None
    return ctx.emit(isa.Scatter, op, update_window_dims=dims.update_window_dims,
                    inserted_window_dims=dims.inserted_window_dims,
                    input_batching_dims=dims.input_batching_dims,
                    scatter_indices_batching_dims=dims.scatter_indices_batching_dims,
                    scatter_dims_to_operand_dims=dims.scatter_dims_to_operand_dims,
                    index_vector_dim=dims.index_vector_dim, combiner=combiner,
                    body=None if combiner else body,
                    indices_are_sorted=op.attr("indices_are_sorted", False),
                    unique_indices=op.attr("unique_indices", False))


def scatter_combiner(body: isa.Program) -> str | None:
    """The isa.SCATTER_COMBINERS entry a one-operand update computation is, if any:
    `return update` (jax's .at[].set) or one binary op of the old value and the update."""
    if not body.instructions and len(body.inputs) == 2 and body.outputs == body.inputs[1:]:
        return isa.REPLACE
    combiner = monoid(body)
    return combiner if combiner in isa.SCATTER_COMBINERS else None
