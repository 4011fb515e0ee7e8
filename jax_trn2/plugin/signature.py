"""The optimized program jaxlib reads a compiled program's layouts from.

jax learns the shardings of what a program returns (and takes) from the HloModule its
compiler produced: the entry's parameter and root shardings and its entry layout. The
simulator compiles no HLO, so the plugin hands jaxlib a module with main's signature alone:
each parameter and result with its sharding over the devices (how XLA lays them out,
lowering.partition.layouts), results computed as zeros. It is made from StableHLO by
jaxlib's own converter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import _jax, xla_client
from jaxlib.mlir import ir


def hlo_sharding(dim_axes: tuple | None, axis_sizes: tuple[int, ...]) -> str:
    """The HloSharding text (mhlo.sharding) of a layout: dim d split over the mesh axes
    dim_axes[d] (major first), the other axes replicated; devices are numbered row-major
    over the mesh (partition order)."""
    if not dim_axes or not any(dim_axes):
        return "{replicated}"
    used = [a for axes in dim_axes for a in axes]
    unused = [a for a in range(len(axis_sizes)) if a not in used]
    tiles = [int(np.prod([axis_sizes[a] for a in axes], dtype=np.int64)) for axes in dim_axes]
    replicated = int(np.prod([axis_sizes[a] for a in unused], dtype=np.int64))
    sharding = xla_client.HloSharding.iota_tile(
        tiles + ([replicated] if replicated > 1 else []), list(axis_sizes), used + unused,
        [xla_client.OpSharding.Type.REPLICATED] if replicated > 1 else [])
    return str(sharding)


def signature_module(executable: Any) -> tuple[bytes, list[str]]:
    """(HloModuleProto, parameter names) of main's signature with the executable's layouts."""
    program = executable.loaded.program
    sizes = executable._mesh_sizes()
    values = program.values
    arg_types = [_mlir_type(values[v].type) for v in program.inputs]
    res_types = [_mlir_type(values[v].type) for v in program.outputs]
    names = [f"arg{i}" for i in range(len(arg_types))]
    args = ", ".join(
        f"%{name}: {t} {{mhlo.sharding = \"{hlo_sharding(_at(executable.in_layouts, i), sizes)}\"}}"
        for i, (name, t) in enumerate(zip(names, arg_types)))
    results = ", ".join(
        f"{t} {{mhlo.sharding = \"{hlo_sharding(_at(executable.out_layouts, i), sizes)}\"}}"
        for i, t in enumerate(res_types))
    body = [f"    %r{i} = stablehlo.constant dense<{_zero(t)}> : {t}"
            for i, t in enumerate(res_types)]
    returned = ", ".join(f"%r{i}" for i in range(len(res_types)))
    text = "\n".join([
        f"module @{executable.name} attributes {{mhlo.num_partitions = "
        f"{executable.num_partitions} : i32, mhlo.num_replicas = {executable.num_replicas} : i32}} {{",
        f"  func.func public @main({args}) -> ({results}) {{",
        *body,
        f"    return {returned} : {', '.join(res_types)}" if res_types else "    return",
        "  }",
        "}"])
    computation = _jax.mlir.mlir_module_to_xla_computation(text, use_tuple_args=False,
                                                           return_tuple=len(res_types) != 1)
    return computation.as_serialized_hlo_module_proto(), names


def _at(layouts: tuple, i: int) -> tuple | None:
    return layouts[i] if i < len(layouts) else None


def _mlir_type(tensor_type: Any) -> str:
    """A TensorType as MLIR's type text (tensor<4x8xbf16>)."""
    from mesh import dtypes
    with jax_mlir.make_ir_context():
        element = jax_mlir.dtype_to_ir_type(dtypes.numpy_dtype(tensor_type.dtype))
        return str(ir.RankedTensorType.get(tensor_type.shape, element))


def _zero(mlir_type: str) -> str:
    if "complex" in mlir_type:
        return "(0.0, 0.0)"
    if "xi1>" in mlir_type or mlir_type == "tensor<i1>":
        return "false"
    return "0"
