"""Program structure: shard_map bodies, calls, and ops that only carry sharding hints."""

from __future__ import annotations

import dataclasses

from lowering import memory_layouts, mlir, partition
from lowering.registry import CUSTOM_CALL_RULES, MEMORY_NEUTRAL, RULES, custom_call_rule, rule
from lowering.walker import LoweringContext, Op, values_of
from mesh import isa
from mesh.isa.control import Composite


def _dim_axes(ctx: LoweringContext, sharding,
              manual: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The manual mesh axes each dim is split over (other axes in a sharding are
    automatic: the body sees the dim whole along them)."""
    return tuple(tuple(ctx.mesh.axis_index(a) for a in dim if ctx.mesh.axis_index(a) in manual)
                 for dim in sharding.split_dims())


@rule("sdy.manual_computation")
def manual_computation(ctx: LoweringContext, op: Op):
    """A shard_map body: split the global operands by in_shardings, run the body per chip,
    assemble the results by out_shardings.

    Only the manual axes are split (a shard_map with axis_names= some axes, or the nested
    one jax emits for axis_index there): along the others, values keep their layout."""
    manual = tuple(sorted(ctx.mesh.axis_index(a) for a in op.attrs["manual_axes"]))
    manual_axes = manual if len(manual) < ctx.mesh.rank else None  # None: all (the listing)
    pieces = []
    for value, sharding, local in zip(op.operands, op.attrs["in_shardings"],
                                      op.regions[0].arg_types):
        dim_axes = _dim_axes(ctx, sharding, manual)
        split = frozenset(a for axes in dim_axes for a in axes)
        pieces += ctx.emit(isa.Shard, op, ins=(value,), out_types=(local,),
                           varying=(ctx.varying(value) - frozenset(manual)) | split,
                           dim_axes=dim_axes, manual_axes=manual_axes)
    results = ctx.inline_region(op.regions[0], pieces)
    return tuple(ctx.emit(isa.Unshard, op, ins=(value,), out_types=(global_,),
                          varying=ctx.varying(value) - frozenset(manual),
                          dim_axes=_dim_axes(ctx, sharding, manual),
                          manual_axes=manual_axes)[0]
                 for value, sharding, global_ in zip(results, op.attrs["out_shardings"],
                                                     op.result_types))


@rule("stablehlo.tuple")
def tuple_(ctx: LoweringContext, op: Op):
    """A tuple is its elements, kept together while lowering: nothing to run."""
    return (tuple(op.operands),)


@rule("stablehlo.get_tuple_element")
def get_tuple_element(ctx: LoweringContext, op: Op):
    return (op.operands[0][op.attrs["index"]],)


@rule("func.call")
def call(ctx: LoweringContext, op: Op):
    """The function inlined; a call that stands for a fused-kernel composite (one XLA's
    partitioner kept: lowering.partition.KERNEL_NAME), that composite again."""
    kernel = op.attr(partition.FRONTEND_ATTRIBUTES, {})
    if partition.KERNEL_NAME in kernel:
        return _composite(ctx, op, kernel[partition.KERNEL_NAME], 0,
                          kernel[partition.KERNEL_ATTRIBUTES], op.attrs["callee"])
    return ctx.call(op.attrs["callee"], op.operands, op)


@rule("stablehlo.composite")
def composite(ctx: LoweringContext, op: Op):
    """The composite's decomposition, as a sub-program listed under the composite's name;
    a CHLO op the simulator has (chlo.erf, chlo.top_k, ...), as that op: a module
    serialized for a PJRT plugin carries such ops as composites named after them, their
    decomposition an approximation other than the op's own."""
    if op.attrs["name"].startswith("chlo.") and op.attrs["name"] in RULES:
        return RULES[op.attrs["name"]](ctx, dataclasses.replace(
            op, name=op.attrs["name"], attrs=op.attr("composite_attributes", {}), regions=()))
    return _composite(ctx, op, op.attrs["name"], op.attr("version", 0),
                      partition.composite_attributes_text(op.attr("composite_attributes", {})),
                      op.attrs["decomposition"])


def _composite(ctx: LoweringContext, op: Op, name: str, version: int, attributes: str,
               function: str):
    program = ctx.function_program(function, op.operands, f"@{function}", op)
    return ctx.emit(Composite, op, out_layouts=[program.info(v).varying
                                                for v in program.outputs],
                    name=name, version=version, attributes=attributes, decomposition=program)


IDENTITY_OPS = ("sdy.sharding_constraint", "sdy.reshard", "sdy.propagation_barrier",
                "stablehlo.optimization_barrier", "mhlo.copy")


@rule(*IDENTITY_OPS)
def identity(ctx: LoweringContext, op: Op):
    """Sharding hints and barriers do not change values; nor does the copy XLA's
    partitioner leaves where a value changes sharding (XLA removes it as a no-op copy
    before code generation, so it costs nothing)."""
    return op.operands


@custom_call_rule(memory_layouts.LAYOUT_CONSTRAINT)
def layout_constraint(ctx: LoweringContext, op: Op):
    """jax's with_sharding_constraint to a Format: the value is unchanged; only the order
    of its bytes in memory is constrained (lowering.memory_layouts), which the simulator's
    logical values do not have."""
    if op.operand_types != op.result_types:
        raise ValueError("a LayoutConstraint custom call that changes its operand's type")
    return op.operands


# jax.lax.dce_sink's custom call target (with prevent_mlir_dce=True)
DCE_SINK = "dce_sink"


@custom_call_rule(DCE_SINK)
def dce_sink(ctx: LoweringContext, op: Op):
    """jax.lax.dce_sink(x, prevent_mlir_dce=True): a use of its operands that keeps jax's
    and XLA's dead-code elimination from removing their computation (the module and
    `compiled.as_text()` show it); it computes nothing and has no results (XLA's own
    handler does nothing). The Trn2 program, which computes only what its outputs and
    effects need, leaves out what only the sink reads."""
    if op.result_types:
        raise ValueError(f"a {DCE_SINK} custom call with results {op.result_types}")
    return ()


MEMORY_NEUTRAL.update(IDENTITY_OPS, ("stablehlo.tuple", "stablehlo.get_tuple_element",
                                     "annotate_device_placement", DCE_SINK,
                                     memory_layouts.LAYOUT_CONSTRAINT))

# The frontend attribute of annotate_device_placement naming the memory kind its result is
# placed in (jax.device_put to a memory kind inside jit, compute_on's results).
BUFFER_PLACEMENT = "_xla_buffer_placement"


@custom_call_rule("annotate_device_placement")
def device_placement(ctx: LoweringContext, op: Op):
    """A value placed in another memory (jax.device_put to a memory kind: pinned_host for
    offloading): an isa.HostTransfer over the chip's PCIe link where it moves between HBM
    and host memory (an offload or a reload), the value itself where it stays on its side
    of the link. The result's memory kind is given back to the caller as jax gives it
    (lowering.partition.result_memory_kinds)."""
    destination = op.attr(partition.FRONTEND_ATTRIBUTES, {}).get(BUFFER_PLACEMENT)
    if destination is None:
        raise ValueError("annotate_device_placement names no memory kind "
                         f"(no {BUFFER_PLACEMENT} frontend attribute)")
    to_host = destination in isa.HOST_MEMORIES
    if not to_host and destination != isa.DEVICE_MEMORY:
        raise NotImplementedError(
            f"annotate_device_placement to memory kind {destination!r}: jax-trn2 has "
            f"{(isa.DEVICE_MEMORY, *isa.HOST_MEMORIES)}")
    host_values = ctx.walker.host_values
    if not to_host:
        return tuple(ctx.walker.in_hbm(ctx, op, value) for value in op.operands)
    results = []
    for value in op.operands:
        if value not in host_values:
            (value,) = ctx.emit(isa.HostTransfer, op, ins=(value,),
                                out_types=(ctx.type(value),), memory_kind=destination)
            host_values[value] = destination
        results.append(value)
    return tuple(results)


@rule("stablehlo.custom_call")
def custom_call(ctx: LoweringContext, op: Op):
    target = op.attrs["call_target_name"]
    if target in CUSTOM_CALL_RULES:
        return _with_tuple_results(ctx, op, CUSTOM_CALL_RULES[target])
    if target == "CustomSPMDPartitioning":
        raise NotImplementedError(
            "jax.experimental.custom_partitioning partitions with a Python callback that "
            "jax-trn2 cannot run: write the partitioned computation with jax.shard_map")
    raise NotImplementedError(f"stablehlo.custom_call @{target} is not supported by jax-trn2")


def _with_tuple_results(ctx: LoweringContext, op: Op, target_rule) -> tuple:
    """The target's rule, given the op's results as a flat list of tensors: XLA's
    partitioner returns a custom call's several results (or none) as one tuple (`tuple<>`
    when there are none), which get_tuple_element then takes apart."""
    if not any(isinstance(t, mlir.TupleType) for t in op.result_types):
        return target_rule(ctx, op)
    leaf_types = tuple(leaf for t in op.result_types
                       for leaf in (t.leaves() if isinstance(t, mlir.TupleType) else (t,)))
    outs = iter(target_rule(ctx, dataclasses.replace(op, result_types=leaf_types)))
    return tuple(values_of(t, lambda _: next(outs)) for t in op.result_types)


@rule("sdy.sharding_group")
def sharding_group(ctx: LoweringContext, op: Op):
    """shard_alike's hint that values share a sharding: no value, nothing to run."""
    return ()
