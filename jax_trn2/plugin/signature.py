"""A compiled program's shardings and its optimized program, as jaxlib reads them.

jax learns the shardings of what a program takes and returns from its compiler: here from
PJRT's shardings extension (`shardings`: each parameter's and result's HloSharding over the
devices, how XLA lays them out, lowering.partition.layouts), asked for at every compile.
The optimized program, which `compiled.as_text()` shows, is made only when asked for: a
module of main's signature with those shardings and the executable's layouts, whose body
is, of a program XLA's partitioner partitioned, the per-chip module the simulator runs; of
a program on one device, that program; of any other (an SPMD module of several processes,
or one with tokens), none: its results computed as zeros. Like the module an SPMD compiler
leaves, it is one device's program: its parameters and results have the per-device
shapes, and the shardings say how they make the global values. It is made from StableHLO
by jaxlib's own converter (about 2 ms a program).
"""

from __future__ import annotations

import re
from typing import Any

from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import _jax, xla_client
from jaxlib.mlir import ir

from jax_trn2.plugin import proto
from lowering import dynamic_shapes, hlo_sharding, mlir
from mesh import sharding


def shardings(executable: Any,
              partitioned: ir.Module | None = None) -> tuple[list[str], list[str]]:
    """The HloShardings (XLA's text) of the executable's parameters and results over its
    devices: of its layouts, but XLA's own (the partitioner's, on `partitioned`) for those
    whose devices are not in the mesh's order. What jaxlib reads as the executable's
    parameter and output shardings (PJRT's shardings extension), and what the optimized
    program says."""
    sizes = executable._mesh_sizes()
    arg_shardings = [str(hlo_sharding.of_layout(layout, sizes, partial))
                     for layout, partial in _arg_layouts(executable)]
    res_shardings = [str(hlo_sharding.of_layout(layout, sizes, partial))
                     for layout, partial in _result_layouts(executable)]
    if partitioned is not None:
        arg_shardings, res_shardings = _with_reordered_devices(
            partitioned, executable.loaded.program.mesh, arg_shardings, res_shardings)
    return arg_shardings, res_shardings


def signature_module(executable: Any, module: ir.Module,
                     partitioned: ir.Module | None = None) -> bytes:
    """An HloModuleProtoWithConfig of main's signature in `module` (jax's, with the global
    types) with the executable's layouts, each type cut to one device's piece. Its body is
    `partitioned`'s, when given (the per-chip module XLA's partitioner made of `module`,
    which the simulator runs: compiled.as_text() then shows the partitioner's collectives),
    and main has no tokens (that module keeps them as tokens, where jax passes arrays)."""
    from lowering.partition import main_function
    main = main_function(module)
    block = main.regions[0].blocks[0]
    sizes = executable._mesh_sizes()
    arg_types = [_type(a.type, layout, sizes)
                 for a, (layout, _) in zip(block.arguments, _arg_layouts(executable))]
    returned_values = list(block.operations[-1].operands)
    res_types = [_type(v.type, layout, sizes)
                 for v, (layout, _) in zip(returned_values, _result_layouts(executable))]
    names = [f"arg{i}" for i in range(len(arg_types))]
    arg_shardings, res_shardings = executable.shardings
    args = ", ".join(f"%{name}: {t} {{mhlo.sharding = \"{sharding}\"}}"
                     for name, t, sharding in zip(names, arg_types, arg_shardings))
    results = ", ".join(f"{t} {{mhlo.sharding = \"{sharding}\"}}"
                        for t, sharding in zip(res_types, res_shardings))
    body = [f"    %r{i} = {_zero(v.type, t)}"
            for i, (v, t) in enumerate(zip(returned_values, res_types))]
    returned = ", ".join(f"%r{i}" for i in range(len(res_types)))
    text = "\n".join([
        f"module @{_symbol(executable.name)} attributes {{mhlo.num_partitions = "
        f"{executable.num_partitions} : i32, mhlo.num_replicas = "
        f"{executable.num_replicas} : i32}} {{",
        f"  func.func public @main({args}) -> ({results}) {{",
        *body,
        f"    return {returned} : {', '.join(res_types)}" if res_types else "    return",
        "  }",
        "}"])
    has_tokens = _TOKEN_TYPE in arg_types + res_types
    return_tuple = len(res_types) != 1
    # a program on one device is its own per-device program (once its shapes are static)
    body = partitioned if partitioned is not None else module \
        if executable.num_partitions * executable.num_replicas == 1 and \
        not dynamic_shapes.needs_refinement(module) else None
    hlo = _hlo(text if body is None or has_tokens else jax_mlir.module_to_bytecode(body),
               return_tuple)
    return proto.hlo_module_with_config(
        hlo, names, *executable.op_shardings,
        [layout[::-1] for layout in executable.parameter_memory_layouts],
        [layout[::-1] for layout in executable.output_memory_layouts])


def _hlo(source: str | bytes, return_tuple: bool) -> bytes:
    """A serialized HloModuleProto of a StableHLO module (text or bytecode), by jaxlib's
    converter."""
    computation = _jax.mlir.mlir_module_to_xla_computation(source, use_tuple_args=False,
                                                           return_tuple=return_tuple)
    return computation.as_serialized_hlo_module_proto()


def _symbol(name: str) -> str:
    """A module name as MLIR spells the symbol: bare if it is an identifier, else quoted
    (jax names a primitive's program after it: `jit_scatter-add`)."""
    if _BARE_ID.fullmatch(name):
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


_BARE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*")  # MLIR's bare-id


def op_sharding(text: str) -> bytes:
    """A serialized OpSharding of an HloSharding's text."""
    return xla_client.HloSharding.from_string(text).to_proto().SerializeToString()


def _with_reordered_devices(partitioned: ir.Module, mesh: Any, arg_shardings: list[str],
                            res_shardings: list[str]) -> tuple[list[str], list[str]]:
    """The shardings, with XLA's own (the partitioner's, on `partitioned`) for the
    parameters and results whose devices are not in the mesh's order: their layouts say
    only that each device holds its own piece (lowering.walker's _main_layout)."""
    from lowering import partition
    attrs = mlir.Attributes(partitioned.operation)
    xla_args = list(attrs.get(partition.PARAMETER_SHARDINGS_ATTR, ()))
    xla_results = hlo_sharding.elements(attrs[partition.OUTPUT_SHARDING_ATTR],
                                        len(res_shardings)) if res_shardings else []

    def chosen(ours: list[str], xla: list[str]) -> list[str]:
        if len(xla) != len(ours):  # (XLA leaves none on a program without parameters)
            return ours
        return [theirs if (tiling := hlo_sharding.parse(theirs, unreduced=True)) is not None
                and not hlo_sharding.follows_mesh(tiling, mesh) else mine
                for mine, theirs in zip(ours, xla)]

    return chosen(arg_shardings, xla_args), chosen(res_shardings, xla_results)


def _arg_layouts(executable: Any) -> list[tuple[tuple | None, tuple[int, ...]]]:
    """Each parameter's layout and unreduced axes (_split)."""
    return [_split(executable.in_layouts, executable.in_partials, i)
            for i in executable.arg_slots]


def _result_layouts(executable: Any) -> list[tuple[tuple | None, tuple[int, ...]]]:
    """Each result's layout and unreduced axes (_split)."""
    return [_split(executable.out_layouts, executable.out_partials, i)
            for i in executable.result_slots]


def _split(layouts: tuple, partials: tuple, i: int | None) -> tuple[tuple | None,
                                                                    tuple[int, ...]]:
    """The layout of the executable's input or output i (None: replicated) over jax's
    value's dims, and the mesh axes it is unreduced along (the program stacks the partial
    sums along leading dims of their own, each split over one axis: isa.Program)."""
    layout = layouts[i] if i is not None and i < len(layouts) else None
    count = partials[i] if i is not None and i < len(partials) else 0
    if not count:
        return layout, ()
    return layout[count:], tuple(axes[0] for axes in layout[:count])


def _type(value_type: ir.Type, layout: tuple | None, sizes: tuple[int, ...]) -> str:
    """A parameter's or result's type as one device takes or gives it: its piece under
    `layout` (None: replicated); a token (of an ordered effect) as an empty array, as jax
    passes its runtime tokens."""
    if str(value_type) == "!stablehlo.token":
        return _TOKEN_TYPE
    tensor = ir.RankedTensorType(value_type)
    shape = sharding.local_shape(tensor.shape, layout or ((),) * tensor.rank, sizes)
    return "tensor<" + "".join(f"{n}x" for n in shape) + f"{tensor.element_type}>"


_TOKEN_TYPE = "tensor<0xi1>"


def _zero(value_type: ir.Type, type_text: str) -> str:
    """An op making a value of `type_text`, the type _type gives `value_type` (its result
    is never read)."""
    if type_text == _TOKEN_TYPE:
        return f"stablehlo.constant dense<> : {_TOKEN_TYPE}"
    element = str(ir.RankedTensorType(value_type).element_type)
    if element.startswith("complex<"):
        literal = "(0.0, 0.0)"
    elif element == "i1":
        literal = "false"
    elif element.startswith(("i", "ui", "si")):
        literal = "0"
    else:
        literal = "0.0"
    return f"stablehlo.constant dense<{literal}> : {type_text}"
