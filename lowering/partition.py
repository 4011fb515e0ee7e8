"""Each chip's program of an auto-partitioned module, as XLA's SPMD partitioner makes it.

A jax program with NamedShardings (in_shardings, with_sharding_constraint, sharding in
types) is a global program: XLA's partitioner (Shardy, then GSPMD's spmd-partitioning pass)
decides what each chip computes and inserts the collectives. jax-trn2 does not partition:
it compiles the module on a host CPU client with one device per chip, with SPMD
partitioning on, and takes the module the `spmd-partitioning` pass produced (XLA dumps it as
an HloProto; jaxlib converts HLO to StableHLO). That module is the per-chip program, with
the parameter shardings (`mhlo.sharding`), the inserted collectives and the user's source
locations, and it is lowered like any SPMD module.

Costs (XLA's compile up to the partitioned module's dump, then stopped, see _STOP_TARGET):
about 0.02 s for a small MLP, 0.7 s of CPU time for a Llama-3 70B training step, of
which the part after the dump runs on a thread of its own while the program is lowered
(lowering.stopped_compile); jax_trn2.jit caches the result per signature as it caches
the program.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable

import numpy as np
from jax._src.interpreters import mlir as jax_mlir
from jax._src.lib import _jax
from jax._src.lib import xla_client
from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import func, sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from lowering import (combine, hlo_sharding, mlir, partition_cache, protobuf, replica_groups,
                      stopped_compile, xla_log)
from lowering.errors import LoweringError
from lowering.host import host_client
from mesh import isa
from mesh.fused_kernels import FUSED_KERNELS

# Module attributes the partitioner leaves on a per-chip program.
PARAMETER_SHARDINGS_ATTR = "mhlo.spmd_parameters_shardings"
OUTPUT_SHARDING_ATTR = "mhlo.spmd_output_sharding"
_DUMP_PASS = "spmd-partitioning"
# The pass XLA runs next in its partitioner pipeline, inlining the calls the partitioner
# left (shard_map bodies, resharding), not fused kernels' ("inlineable" = "false"): its
# module is the one XLA's later passes, and lowering.combine, see.
_INLINER_PASS = "call-inliner"
# A composite that names a fused kernel (mesh.fused_kernels.FUSED_KERNELS: flash attention)
# crosses XLA as a call its inliner must keep ("inlineable" = "false", XLA's frontend
# attribute for that), with the composite's name and attributes in these frontend
# attributes; XLA's partitioner partitions the called function like any other, and
# lowering makes the call a composite again (lowering.rules.structure).
FRONTEND_ATTRIBUTES = "mhlo.frontend_attributes"
KERNEL_NAME = "jax_trn2.kernel"
KERNEL_ATTRIBUTES = "jax_trn2.kernel_attributes"


def is_partitioned(module: ir.Module) -> bool:
    """Whether the module is a per-chip program XLA's partitioner made. XLA leaves no
    parameter shardings on a program without parameters (e.g. a shard_map of constants),
    nor an output sharding on one without results: either attribute says so."""
    attributes = module.operation.attributes
    return PARAMETER_SHARDINGS_ATTR in attributes or OUTPUT_SHARDING_ATTR in attributes


# Custom calls only XLA's partitioner can answer, with a Python callback jaxlib registers
# for it: jax.debug.inspect_array_sharding (and visualize_sharding) inside jit, which calls
# jax's callback with the value's HloSharding and is then removed; and
# jax.experimental.custom_partitioning, whose callback gives each chip's computation.
_INSPECT_SHARDING_TARGET = "InspectSharding"
_CUSTOM_PARTITIONING_TARGET = "CustomSPMDPartitioning"


def needs_partitioning(module: ir.Module) -> bool:
    """Whether a module is a global program over a mesh of several devices whose values
    carry shardings outside shard_map bodies (what XLA's partitioner would split), or
    whose shard_maps are over several meshes of the same devices (a (2, 4) mesh and its
    flattening, say), or over a mesh of its devices in another order (an sdy.mesh with
    explicit device ids): the partitioner makes one per-chip program of them all. So is
    one that inspects a value's sharding, or uses custom_partitioning over such a mesh,
    which only the partitioner can answer.

    A program whose shardings are all at shard_map boundaries of one mesh is already
    per-chip code inside the bodies and runs as it is (lowering.rules.structure)."""
    if is_partitioned(module):
        return False
    if _calls(module.operation, _INSPECT_SHARDING_TARGET):
        return True
    if _sdy_mesh_devices(module) > 1:
        return _calls(module.operation, _CUSTOM_PARTITIONING_TARGET) or \
            _has_sdy_sharding(module) or len(_distinct_meshes(module)) > 1 or \
            _reorders_devices(module)
    return _has_gspmd_tiling(module)


def layouts(module: ir.Module, program: isa.Program) -> tuple[tuple, tuple]:
    """How XLA lays main's arguments and results out over the mesh, as dim_axes per leaf
    (None: replicated): a partitioned program's are the partitioner's own, as are those of
    a program with no shard_map (replicated); the arguments and results of shard_maps left
    unpartitioned are laid out as Shardy propagates their in_specs and out_specs."""
    if needs_partitioning(module) or is_partitioned(module) or \
            not _has_op(module.operation, "sdy.manual_computation"):
        return program.input_shardings, program.output_shardings
    return propagated_layouts(module)


def _has_op(operation, name: str) -> bool:
    return any(op.operation.name == name or _has_op(op.operation, name)
               for region in operation.regions for block in region.blocks
               for op in block.operations)


def global_mesh(module: ir.Module) -> isa.MeshSpec:
    """The mesh of a global program: its sdy.mesh, or (GSPMD) the one its tilings are of."""
    meshes = [mlir.mesh_spec(op.operation) for op in module.body.operations
              if op.operation.name == "sdy.mesh"]
    mesh = max(meshes, key=lambda m: m.num_devices, default=None) or \
        hlo_sharding.module_mesh(module)
    if mesh is None:
        raise LoweringError("a sharded program without a mesh")
    return mesh


# A function giving XLA's error after partitioning, if any (see `partition`)
XlaFailure = Callable[[], Exception | None]


def _no_failure() -> None:
    return None


def partition(module: ir.Module, num_devices: int) -> tuple[ir.Module, XlaFailure]:
    """The per-chip program XLA's SPMD partitioner makes of `module` for `num_devices`
    chips (device i = partition i), as a StableHLO module; and a function giving the error
    XLA:CPU raised after partitioning, if it did before the stop (_STOP_TARGET) (it lacks
    some ops that the simulator has; if lowering the partitioned program fails too, XLA's
    reason belongs in that error), which waits for XLA's compile to end: it goes on after
    the partitioned module is read (lowering.stopped_compile). The last few are remembered
    (the trn2 plugin asks again for the program it lowered: for the shardings jaxlib reads
    at every compile; jax lowers a program again for a new jit of the same function), and
    kept beside jax's persistent compilation cache when that is on (lowering.partition_cache),
    for another process to read."""
    bytecode = jax_mlir.module_to_bytecode(module)
    key = (bytecode, num_devices)
    with _PARTITIONED_LOCK:
        if key in _PARTITIONED:
            _PARTITIONED[key] = _PARTITIONED.pop(key)  # the most recent last
            return _PARTITIONED[key]
    result = _kept_or_partitioned(module, bytecode, num_devices)
    with _PARTITIONED_LOCK:
        _PARTITIONED[key] = result
        while len(_PARTITIONED) > _PARTITIONED_KEPT or len(_PARTITIONED) > 1 and \
                sum(len(code) for code, _ in _PARTITIONED) > _PARTITIONED_BYTES:
            del _PARTITIONED[next(iter(_PARTITIONED))]
    return result


# partition's memory: (module bytecode, devices) -> its result, least recent first; at
# most this many, keyed by at most this many bytes of bytecode (each with the partitioned
# module it maps to, in memory). jax's own tests partition 85 of pjit_test's 1,128
# programs again when only the last 4 are kept (for a new jit of the same function).
_PARTITIONED: dict[tuple[bytes, int], tuple[ir.Module, XlaFailure]] = {}
_PARTITIONED_KEPT = 64
_PARTITIONED_BYTES = 16 << 20
_PARTITIONED_LOCK = threading.Lock()


def _kept_or_partitioned(module: ir.Module, bytecode: bytes,
                         num_devices: int) -> tuple[ir.Module, XlaFailure]:
    """`partition`'s result as lowering.partition_cache keeps it (with XLA's log, reported
    again), else XLA's (then kept there, once XLA's compile has ended without an error)."""
    entry = partition_cache.key(bytecode, num_devices)
    kept = _read_kept(entry)
    if kept is not None:
        xla_log.report(kept[1])
        return kept[0], _no_failure
    log: list[str] = []
    try:
        # one partitioning at a time: the capture redirects the process's stderr
        with _XLA_LOCK, xla_log.captured_stderr() as log:  # XLA's warnings, said below
            partitioned, xla_compile = _partition(module, num_devices)
    finally:
        xla_log.report(log)
    where = partition_cache.directory()
    if where is not None:
        data = protobuf.field_bytes(1, jax_mlir.module_to_bytecode(partitioned)) + \
            b"".join(protobuf.field_bytes(2, line.encode()) for line in log)
        xla_compile.when_ended(lambda failure: partition_cache.write(entry, data, where)
                               if failure is None else None)
    return partitioned, xla_compile.failure


def _read_kept(entry: str) -> tuple[ir.Module, list[str]] | None:
    """The module and XLA's log that lowering.partition_cache keeps as `entry`; None if it
    keeps none, or an entry it cannot read (cut short by a crash, say: XLA partitions the
    program again, and the entry is written anew)."""
    kept = partition_cache.read(entry)
    if kept is None:
        return None
    try:
        fields = list(protobuf.fields(kept))
        (partitioned,) = (value for number, value in fields if number == 1)
        log = [line.decode() for number, line in fields if number == 2]
        return mlir.parse(partitioned), log
    except Exception:  # (a damaged entry fails in the wire format, the unpacking or MLIR)
        return None


_XLA_LOCK = threading.Lock()


def _partition(module: ir.Module,
               num_devices: int) -> tuple[ir.Module, stopped_compile.StoppedCompile]:
    """`partition`, by XLA (its log going to stderr), and XLA's compile, which goes on."""
    client = host_client(num_devices)
    options = xla_client.CompileOptions()
    build = options.executable_build_options
    build.num_replicas = 1
    build.num_partitions = num_devices
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = _sdy_mesh_devices(module) > 0
    if not build.use_shardy_partitioner:  # as jax compiles: results it gave no sharding
        build.allow_spmd_sharding_propagation_to_output = _unsharded_results(module)
    build.device_assignment = xla_client.DeviceAssignment.create(
        np.arange(num_devices).reshape(1, num_devices))
    code = _for_xla(module)

    def run_to_the_stop(dump: str) -> Exception | None:
        options.env_option_overrides = [
            ("xla_dump_to", dump), ("xla_dump_hlo_pass_re", f"{_DUMP_PASS}|{_INLINER_PASS}"),
            ("xla_dump_hlo_as_proto", True), ("xla_dump_hlo_as_text", True),
            *_UNTIL_THE_STOP,
        ]
        try:
            client.compile_and_load(code, xla_client.DeviceList(tuple(client.devices())),
                                    options)
        except Exception as e:  # jaxlib raises its own XlaRuntimeError
            # after partitioning, XLA:CPU stops at the stop op, or fails on an op of its
            # own before it
            return None if _STOP_TARGET in str(e) else e
        return None

    compile_run = stopped_compile.StoppedCompile(run_to_the_stop)
    try:
        partitioned_dump = compile_run.partitioned_dump(_DUMP_PASS, _INLINER_PASS)
        if partitioned_dump is None:
            failure = compile_run.failure()
            raise LoweringError(
                f"XLA's SPMD partitioner rejected the program: {failure}" if failure else
                f"XLA's SPMD partitioner left no partitioned module (no *after_{_DUMP_PASS}* "
                "dump)")
        with open(partitioned_dump, "rb") as f:
            hlo_proto = f.read()
        with open(partitioned_dump[:-len(".hlo.pb")] + ".txt") as f:
            mesh_groups = _mesh_replica_groups(f.read())
    finally:
        compile_run.release()
    stablehlo = _jax.mlir.hlo_to_stablehlo(_hlo_module_proto(hlo_proto))
    partitioned = mlir.parse(stablehlo)
    _remove_stop(partitioned)
    _set_replica_groups(partitioned, mesh_groups)
    _carry_marks(module, partitioned)
    combine.combine_all_reduces(partitioned)
    return partitioned, compile_run


def composite_attributes_text(attributes: dict) -> str:
    """A composite's attributes as the listing shows them: `{causal=True, scale=0.125}`."""
    return "{" + ", ".join(f"{k}={v}" for k, v in attributes.items()) + "}"


def _for_xla(module: ir.Module) -> bytes:
    """Bytecode of a copy of `module` for XLA: fused kernels as calls XLA keeps, and a stop
    op after the partitioner (the module itself is not changed)."""
    copy = ir.Module.parse(jax_mlir.module_to_bytecode(module), module.context)
    _kernels_as_calls(copy)
    _without_dot_algorithms(copy)
    _insert_stop(copy)
    return jax_mlir.module_to_bytecode(copy)


def _without_dot_algorithms(module: ir.Module) -> None:
    """Drop dot_general's `algorithm` (lax.dot's precision=DotAlgorithmPreset...) from the
    copy for XLA: XLA:CPU's compiler crashes (SIGSEGV) on those it cannot compute, before
    the partitioner, which does not read them. jax has converted the operands to the
    algorithm's input types already, and lowering reads no algorithm either: the
    partitioned module computes the same."""
    def visit(operation) -> None:
        for region in operation.regions:
            for block in region.blocks:
                for op in block.operations:
                    if op.operation.name == "stablehlo.dot_general" and \
                            "algorithm" in op.operation.attributes:
                        del op.operation.attributes["algorithm"]
                    visit(op.operation)

    visit(module.operation)


def _kernels_as_calls(module: ir.Module) -> None:
    """Make `module`'s fused-kernel composites calls XLA keeps (see FRONTEND_ATTRIBUTES)."""
    kernels = []

    def visit(operation) -> None:
        for region in operation.regions:
            for block in region.blocks:
                for op in block.operations:
                    if op.operation.name == "stablehlo.composite" and \
                            ir.StringAttr(op.operation.attributes["name"]).value in FUSED_KERNELS:
                        kernels.append(op.operation)
                    visit(op.operation)

    visit(module.operation)
    for op in kernels:
        attributes = mlir.Attributes(op)
        with op.location, ir.InsertionPoint(op):
            call = func.CallOp([r.type for r in op.results],
                               ir.FlatSymbolRefAttr.get(attributes["decomposition"]),
                               list(op.operands))
            call.operation.attributes[FRONTEND_ATTRIBUTES] = ir.DictAttr.get({
                "inlineable": ir.StringAttr.get("false"),
                KERNEL_NAME: ir.StringAttr.get(attributes["name"]),
                KERNEL_ATTRIBUTES: ir.StringAttr.get(composite_attributes_text(
                    attributes.get("composite_attributes", {})))})
        for old, new in zip(op.results, call.results):
            old.replace_all_uses_with(new)
        op.erase()


# XLA compiles the module past the partitioner only for the dump; the rest (XLA:CPU's own
# passes, then code generation for every fused kernel) is wasted: 1.3 s of CPU time for a
# Llama-3 70B training step, of 2.0 s. A host callback for GPUs, which the CPU compiler
# has no handler for, stops it where it emits the program's first instructions: 0.7 s.
# XLA keeps a side-effecting op with no results only if it is one of jax's host
# callbacks, given a device (jax's maximal sharding, as jax gives its callbacks).
_STOP_TARGET = "xla_ffi_python_gpu_callback"
_STOP_MESH = "jax_trn2_stop_mesh"
# XLA's options for the compile up to the stop, which cut the work done before it
# and leave the partitioner's pipeline (XLA:CPU's "spmd-partitioner", which reads
# neither) as it is: LLVM's least optimization, and XLA:CPU's legacy kernel emitters,
# which emit no kernel's code before the stop, where its fusion emitters compile each
# kernel scheduled before it (a 2x4-mesh program's compile: 31 -> 18 ms).
_UNTIL_THE_STOP = (("xla_backend_optimization_level", 0),
                   ("xla_cpu_use_fusion_emitters", False))


def _insert_stop(copy: ir.Module) -> None:
    """Put a stop op first in `copy`'s main."""
    shardy = _sdy_mesh_devices(copy) > 0
    with copy.context, ir.Location.unknown():
        if shardy:
            ir.InsertionPoint.at_block_begin(copy.body).insert(ir.Operation.parse(
                f"sdy.mesh @{_STOP_MESH} = <[], device_ids=[0]>", context=copy.context))
        sharding = {"sdy.sharding": ir.Attribute.parse(
            f"#sdy.sharding_per_value<[<@{_STOP_MESH}, []>]>")} if shardy else \
            {"mhlo.sharding": ir.StringAttr.get("{maximal device=0}")}
        ir.Operation.create(
            "stablehlo.custom_call", results=[], operands=[],
            attributes={"call_target_name": ir.StringAttr.get(_STOP_TARGET),
                        "has_side_effect": ir.BoolAttr.get(True),
                        "api_version": ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 4),
                        **sharding},
            ip=ir.InsertionPoint.at_block_begin(main_function(copy).regions[0].blocks[0]))


def _remove_stop(module: ir.Module) -> None:
    """Remove the stop op from the partitioned module: the conditional the partitioner
    put it in (run on device 0), what made its predicate, and the functions of its
    branches."""
    main = main_function(module)
    for op in list(main.regions[0].blocks[0].operations):
        if op.operation.name == "stablehlo.if" and _calls_stop(op.operation):
            feeding = [operand.owner for operand in op.operation.operands]
            op.operation.erase()
            _erase_if_unused(feeding)
    for op in list(module.body.operations):
        if op.operation.name == "func.func" and op.operation is not main and \
                _calls_stop(op.operation):
            op.operation.erase()


def _calls_stop(operation) -> bool:
    return _calls(operation, _STOP_TARGET)


def _calls(operation, target: str) -> bool:
    """Whether a custom call to `target` is among the ops inside `operation`, at any depth."""
    return any(op.operation.name == "stablehlo.custom_call" and
               ir.StringAttr(op.operation.attributes["call_target_name"]).value == target
               or _calls(op.operation, target)
               for region in operation.regions for block in region.blocks
               for op in block.operations)


def _erase_if_unused(operations) -> None:
    """Erase these ops when nothing uses their results, then the ops feeding them."""
    for op in operations:
        if not isinstance(op, ir.OpView) and not isinstance(op, ir.Operation):
            continue  # a block argument
        op = op.operation
        if all(not list(result.uses) for result in op.results):
            feeding = [operand.owner for operand in op.operands]
            op.erase()
            _erase_if_unused(feeding)


def _unsharded_results(module: ir.Module) -> list[bool]:
    """For each of main's results, whether jax left its sharding to the partitioner (a
    GSPMD module: no mhlo.sharding on it), which jax then lets XLA propagate to it."""
    main = main_function(module)
    count = len(main.regions[0].blocks[0].operations[-1].operands)
    attrs = mlir.Attributes(main).get("res_attrs", ())
    return [not (i < len(attrs) and isinstance(attrs[i], dict) and
                 hlo_sharding.SHARDING_ATTR in attrs[i]) for i in range(count)]


_DONATION_ATTRS = ("tf.aliasing_output", "jax.buffer_donor")
MEMORY_KIND_ATTR = "mhlo.memory_kind"


def _carry_marks(source: ir.Module, target: ir.Module) -> None:
    """Mark main's donated arguments, and the memory kinds of its arguments and results, in
    the partitioned module as jax marked them in the source (the conversion from HLO drops
    the marks)."""
    _carry(source, target, "arg_attrs", (*_DONATION_ATTRS, MEMORY_KIND_ATTR))
    _carry(source, target, "res_attrs", (MEMORY_KIND_ATTR,))


def _carry(source: ir.Module, target: ir.Module, key: str, names: tuple[str, ...]) -> None:
    """Copy the attributes `names` of each entry of main's `key` (arg_attrs or res_attrs)
    from `source` to `target`."""
    source_attrs = main_function(source).attributes
    if key not in source_attrs:
        return
    marks = [{name: str(entry[name]) for name in names if name in entry}
             for entry in map(ir.DictAttr, ir.ArrayAttr(source_attrs[key]))]
    if not any(marks):
        return
    main = main_function(target)
    with target.context:
        current = list(map(ir.DictAttr, ir.ArrayAttr(main.attributes[key]))) \
            if key in main.attributes else [ir.DictAttr.get({})] * len(marks)
        merged = []
        for entry, marked in zip(current, marks, strict=True):
            attrs = {entry[i].name: entry[i].attr for i in range(len(entry))}
            attrs.update({name: ir.Attribute.parse(text) for name, text in marked.items()})
            merged.append(ir.DictAttr.get(attrs))
        main.attributes[key] = ir.ArrayAttr.get(merged)


def main_function(module: ir.Module):
    """The module's function 'main' (its operation)."""
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == "main":
            return op
    raise LoweringError("the module has no function 'main'")


# `replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=16], device_ids=([16,4]T(1,0)) {'axis_0'}`
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\](?:, device_ids=\(([^)]*\)?)\))? "
                          r"\{([^}]*)\}")
_CHANNEL = re.compile(r"channel_id=(\d+)")


def _mesh_replica_groups(hlo_text: str) -> dict[int, np.ndarray]:
    """Device-id groups [groups, size] of each collective (by channel id) whose replica
    groups the partitioner gave as axes of a mesh with its own device order.

    HLO to StableHLO conversion keeps such groups as `#stablehlo.replica_group_mesh_axes`
    over one `sdy.mesh` without the device order, which would misplace them; the HLO text
    has all of it."""
    groups = {}
    for line in hlo_text.splitlines():
        mesh_axes, channel = _MESH_GROUPS.search(line), _CHANNEL.search(line)
        if mesh_axes and channel:
            groups[int(channel.group(1))] = _groups_of_mesh_axes(*mesh_axes.groups())
    return groups


def _groups_of_mesh_axes(mesh_text: str, device_ids: str | None, axes_text: str) -> np.ndarray:
    names, sizes = [], []
    for name, size in re.findall(r"'([^']+)'=(\d+)", mesh_text):
        names.append(name)
        sizes.append(int(size))
    mesh = isa.MeshSpec(tuple(names), tuple(sizes))
    axes = tuple((name, (int(pre), int(size)) if pre else None) for name, pre, size in
                 re.findall(r"'([^']+)'(?::\((\d+)\)(\d+))?", axes_text))
    positions = replica_groups.mesh_axes_groups(mesh, axes)
    return _device_order(device_ids, mesh.num_devices)[positions]


def _device_order(text: str | None, count: int) -> np.ndarray:
    """Device ids in mesh order: iota (`None`), an iota list `[16,4]T(1,0)`, or ids."""
    if not text:
        return np.arange(count)
    iota = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", text.strip())
    if iota:
        dims = [int(d) for d in iota.group(1).split(",")]
        perm = [int(p) for p in iota.group(2).split(",")] if iota.group(2) else \
            list(range(len(dims)))
        return np.arange(count).reshape(dims).transpose(perm).reshape(-1)
    return np.array([int(d) for d in text.split(",")], dtype=np.int64)


def _set_replica_groups(module: ir.Module, groups: dict[int, np.ndarray]) -> None:
    """Replace mesh-axes replica groups by the device-id groups of the same channel."""
    def visit(operation) -> None:
        for region in operation.regions:
            for block in region.blocks:
                for op in block.operations:
                    op = op.operation
                    attrs = op.attributes
                    if "replica_groups" in attrs and "channel_handle" in attrs and \
                            hlo.ReplicaGroupMeshAxesAttr.isinstance(attrs["replica_groups"]):
                        channel = hlo.ChannelHandle(attrs["channel_handle"]).handle
                        if channel not in groups:
                            raise LoweringError(f"no replica groups for channel {channel} in "
                                                "XLA's partitioned module")
                        with module.context:
                            attrs["replica_groups"] = ir.DenseIntElementsAttr.get(
                                np.ascontiguousarray(groups[channel], dtype=np.int64))
                    visit(op)

    visit(module.operation)


def _hlo_module_proto(hlo_proto: bytes) -> bytes:
    """Field 1 (`hlo_module`, an HloModuleProto) of a serialized HloProto."""
    for number, value in protobuf.fields(hlo_proto):
        if number == 1:
            return value
    raise LoweringError("XLA's partitioned-module dump holds no HloModuleProto")


def _sdy_mesh_devices(module: ir.Module) -> int:
    """Devices of the module's largest sdy.mesh (0 without one)."""
    sizes = [mlir.mesh_spec(op.operation).num_devices for op in module.body.operations
             if op.operation.name == "sdy.mesh"]
    return max(sizes, default=0)


def _distinct_meshes(module: ir.Module) -> set[isa.MeshSpec]:
    """The module's sdy.meshes of at least one axis, each once."""
    meshes = {mlir.mesh_spec(op.operation) for op in module.body.operations
              if op.operation.name == "sdy.mesh"}
    return {mesh for mesh in meshes if mesh.rank}


def _reorders_devices(module: ir.Module) -> bool:
    """Whether an sdy.mesh of the module lists its devices in another order than 0, 1, ..."""
    return any(mlir.mesh_device_ids(op.operation) is not None
               for op in module.body.operations if op.operation.name == "sdy.mesh")


_SDY_SHARDING = "sdy.sharding"


def sdy_dim_axes(sharding: Any, mesh: isa.MeshSpec) -> tuple:
    """dim_axes (mesh axis indices per dim) of a decoded sdy.sharding attribute (None:
    none, ())."""
    return () if sharding is None else \
        tuple(tuple(mesh.axis_index(a) for a in dim) for dim in sharding.split_dims())


def _has_sdy_sharding(module: ir.Module) -> bool:
    """A sharding that splits some dim (or is unreduced): on a function's arguments or
    results, other than main's that only cross shard_map boundaries as they are
    (_at_shard_map_boundaries); on an op outside shard_map bodies (sdy.manual_computation);
    in a constraint or reshard there; or at a shard_map's boundary, unreduced."""
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func":
            continue
        is_main = ir.StringAttr(op.attributes["sym_name"]).value == "main"
        for key, values in (("arg_attrs", _arguments), ("res_attrs", _returned)):
            if key not in op.attributes:
                continue
            for entry, value in zip(ir.ArrayAttr(op.attributes[key]), values(op)):
                entry = ir.DictAttr(entry)
                sharding = entry[_SDY_SHARDING] if _SDY_SHARDING in entry else None
                if sharding is not None and _splits(sharding) and \
                        not (is_main and _at_shard_map_boundaries(value, sharding, key)):
                    return True
        if _ops_shard(op):
            return True
    return False


def _arguments(function) -> list:
    return list(function.regions[0].blocks[0].arguments)


def _returned(function) -> list:
    return list(function.regions[0].blocks[0].operations[-1].operands)


def _at_shard_map_boundaries(value: ir.Value, sharding: ir.Attribute, key: str) -> bool:
    """Whether main's argument `value` (key "arg_attrs") goes only into shard_maps that take
    it split as `sharding` says, or its result `value` ("res_attrs") is a shard_map's,
    given split so, each along the shard_map's manual axes only: what XLA's partitioner
    would pass through untouched (eager shard_map runs each op as such a program). Its
    layout is the shard_map's own (propagated_layouts), as its body is per-chip code."""
    if key == "arg_attrs":
        crossings = [(use.owner, "in_shardings", use.operand_number) for use in value.uses]
    elif isinstance(value, ir.OpResult):
        crossings = [(value.owner, "out_shardings", value.result_number)]
    else:  # an argument returned as it is
        return False
    if not crossings:  # an argument nothing uses
        return False
    for op, side, index in crossings:
        if op.name != "sdy.manual_computation" or \
                sdy.TensorShardingPerValueAttr(op.attributes[side]).shardings[index] != sharding:
            return False
        manual = set(mlir.Attributes(op)["manual_axes"])
        split = {ref.name for dim in sdy.TensorShardingAttr(sharding).dimension_shardings
                 for ref in (sdy.AxisRefAttr(a) for a in sdy.DimensionShardingAttr(dim).axes)}
        if not split <= manual:
            return False
    return True


# Ops that give a value a sharding (with_sharding_constraint, sharding in types' reshard):
# one that replicates it asks nothing of the partitioner in a program where nothing is
# split; lowering takes it for the value itself (lowering.rules.structure.IDENTITY_OPS).
_CONSTRAINTS = ("sdy.sharding_constraint", "sdy.reshard")


def _ops_shard(operation) -> bool:
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                op = op.operation
                if op.name == "sdy.manual_computation":
                    if _has_unreduced(op):  # (values lowering takes from the partitioner)
                        return True
                    continue
                if op.name in _CONSTRAINTS and _splits(op.attributes["sharding"]):
                    return True
                if _SDY_SHARDING in op.attributes and _splits(op.attributes[_SDY_SHARDING]):
                    return True
                if _ops_shard(op):
                    return True
    return False


def _has_unreduced(manual_computation) -> bool:
    """Whether a shard_map takes or gives a value unreduced along some axis."""
    return any(list(sdy.TensorShardingAttr(sharding).unreduced_axes)
               for side in ("in_shardings", "out_shardings")
               for sharding in sdy.TensorShardingPerValueAttr(
                   manual_computation.attributes[side]).shardings)


def _splits(attr: ir.Attribute) -> bool:
    """Whether an sdy sharding attribute (of one value, or per value) splits a dim or is
    unreduced along an axis."""
    if sdy.TensorShardingPerValueAttr.isinstance(attr):
        return any(_splits(s) for s in sdy.TensorShardingPerValueAttr(attr).shardings)
    if not sdy.TensorShardingAttr.isinstance(attr):
        return False
    sharding = sdy.TensorShardingAttr(attr)
    return bool(list(sharding.unreduced_axes)) or any(
        list(sdy.DimensionShardingAttr(d).axes) for d in sharding.dimension_shardings)


def _has_gspmd_tiling(module: ir.Module) -> bool:
    """A tiled mhlo.sharding on main's arguments or results (GSPMD: jax without Shardy)."""
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or mlir.Attributes(op).get("sym_name") != "main":
            continue
        attrs = mlir.Attributes(op)
        for key in ("arg_attrs", "res_attrs"):
            for entry in attrs.get(key, ()):
                if isinstance(entry, dict) and hlo_sharding.SHARDING_ATTR in entry and \
                        hlo_sharding.parse(entry[hlo_sharding.SHARDING_ATTR]) is not None:
                    return True
    return False


def main_parameter_count(module: ir.Module) -> int:
    """How many arguments main takes that are not tokens (jax's argument leaves)."""
    return sum(1 for a in main_function(module).regions[0].blocks[0].arguments
               if not mlir.is_token(a.type))


def result_memory_kinds(module: ir.Module) -> list[str | None]:
    """The memory kind jax gives each leaf of main's results (mhlo.memory_kind:
    "pinned_host" for one jax.device_put or out_shardings placed in host memory), None
    where it names none."""
    main = main_function(module)
    return memory_kinds(main.regions[0].blocks[0].operations[-1].operands,
                        mlir.Attributes(main).get("res_attrs", ()))


def memory_kinds(values, attrs: Any) -> list[str | None]:
    """Per leaf of these arguments or results of main (with their arg_attrs or res_attrs),
    its mhlo.memory_kind, None where it names none; tokens have no leaf."""
    kinds = []
    for i, value in enumerate(values):
        if mlir.is_token(value.type):
            continue
        entry = attrs[i] if i < len(attrs) and isinstance(attrs[i], dict) else {}
        type_ = mlir.value_type(value.type)
        leaves = len(type_.leaves()) if isinstance(type_, mlir.TupleType) else 1
        kinds += [entry.get("mhlo.memory_kind")] * leaves
    return kinds


def propagated_layouts(module: ir.Module) -> tuple[tuple, tuple]:
    """How XLA lays main's arguments and results out over the mesh when the module's
    shardings are all at shard_map boundaries (no partitioning needed): Shardy's own
    propagation pipeline (`sdy-propagation-pipeline`, the first thing XLA runs on the
    module) carries each shard_map's in_specs back to the arguments and its out_specs on to
    the results, through the ops between. dim_axes (mesh axis indices per dim) per argument
    and per result that is not a token, None where replicated."""
    mesh = global_mesh(module)
    with module.context:
        copy = module.operation.clone()
        passmanager.PassManager.parse("builtin.module(sdy-propagation-pipeline)").run(copy)
    main = next(op.operation for op in copy.regions[0].blocks[0].operations
                if op.operation.name == "func.func" and
                ir.StringAttr(op.operation.attributes["sym_name"]).value == "main")
    block = main.regions[0].blocks[0]

    def dim_axes(attrs: tuple, values) -> tuple:
        found = []
        for i, value in enumerate(values):
            if mlir.is_token(value.type):
                continue
            entry = attrs[i] if i < len(attrs) and isinstance(attrs[i], dict) else {}
            axes = sdy_dim_axes(entry.get(_SDY_SHARDING), mesh)
            found.append(axes if any(axes) else None)
        return tuple(found)

    attrs = mlir.Attributes(main)
    return (dim_axes(attrs.get("arg_attrs", ()), block.arguments),
            dim_axes(attrs.get("res_attrs", ()), block.operations[-1].operands))
