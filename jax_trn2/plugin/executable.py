"""A program compiled by the plugin: jax_trn2's LoadedExecutable behind PJRT's interface.

PJRT hands a program per-device buffers (one list per device of the device assignment, in
its order: partition-major, as jax's meshes list their devices) and takes per-device
results. The simulator runs on global arrays; each argument is assembled from its pieces
by how XLA lays it out over the mesh (lowering.partition.layouts), and each result is cut
into views, one per device: of its own chip's piece where the program's Unshard would
assemble it (mesh.executor.with_chip_outputs; a value that differs along an axis it is
replicated over keeps each device's own, as on XLA), else of the global array. The pieces share
one storage (handles.Whole): the next program that takes all of them takes its global
array as it is (assembled from the chips' pieces then, once), without comparing; an
argument assembled from pieces put on the devices separately is assembled once.
"""

from __future__ import annotations

import hashlib
import weakref
from typing import Any, Sequence

import numpy as np
from jax._src.lib import xla_client

from jax_trn2.core import donation, lowerings, options
from jax_trn2.plugin import abi, proto
from jax_trn2.plugin.handles import Buffer, Device, Whole
from lowering import protobuf
from mesh import sharding
from mesh.machine import Topology, device_order

_SERIALIZED_MAGIC = b"jax-trn2 executable 1\n"
_LIVE: "weakref.WeakValueDictionary[str, Executable]" = weakref.WeakValueDictionary()


class Executable:
    """A compiled program: its Trn2 executable, the devices it runs on, and what jaxlib
    asks of it (output shardings through the optimized program, costs, HBM use)."""

    def __init__(self, client: Any, code: bytes, compile_options: bytes):
        from jax_trn2.core.chip_pieces import chip_outputs  # the simulator: loaded when used
        from jax_trn2.core.executable import LoadedExecutable
        from lowering import partition

        self.client = client
        self.code, self.compile_options = bytes(code), bytes(compile_options)
        parsed = xla_client.CompileOptions.ParseFromString(self.compile_options)
        build = parsed.executable_build_options
        self.num_replicas, self.num_partitions = build.num_replicas, build.num_partitions
        if build.device_assignment is not None:
            self.assignment = proto.read_device_assignment(
                build.device_assignment.serialize())
        else:
            ids = client.default_assignment(self.num_replicas * self.num_partitions)
            self.assignment = [ids[r * self.num_partitions:(r + 1) * self.num_partitions]
                               for r in range(self.num_replicas)]
        self.options = options.program_options(
            list(parsed.env_option_overrides),
            options.ProgramOptions(client.options.rounding, topology=client.options.topology))
        self.devices: list[Device] = [client.device(d) for row in self.assignment for d in row]
        _refuse_other_processes_devices(self.devices, client.options.process_index)
        self.loaded = LoadedExecutable.from_stablehlo(
            self.options.topology, self.code, rounding=self.options.rounding,
            device_assignment=_chips(self.options.topology, self.devices),
            host_callbacks=lowerings.CALLBACKS)
        self.in_layouts, self.out_layouts = self.loaded.layouts
        program = self.loaded.program
        # the devices' buffers of these are views of their chips' pieces
        self.chip_outputs = set(chip_outputs(program, self.out_layouts))
        self.loaded.return_chip_pieces(sorted(self.chip_outputs))
        self.loaded.load(self.options.check_memory)  # the executor compiles here, on
        # jaxlib's compile thread
        self.in_partials, self.out_partials = program.input_partials, program.output_partials
        module = self.loaded.module
        main = partition.main_function(module).regions[0].blocks[0]
        self.arg_slots = _slots(main.arguments)
        self.result_slots = _slots(main.operations[-1].operands)
        kinds = partition.result_memory_kinds(module)
        self.out_memory_kinds = ["device" if i is None else kinds[i] or "device"
                                 for i in self.result_slots]
        donated = donation.donated_inputs(program)
        self.donated = [k for k, i in enumerate(self.arg_slots) if i in donated]
        self.name = _module_name(module)
        self.fingerprint = hashlib.sha256(self.code + self.compile_options).hexdigest()
        self._optimized: bytes | None = None
        self.owned = abi.Owned()
        self.deleted = False
        _LIVE[self.fingerprint] = self

    # --- running ---------------------------------------------------------------------------

    def execute(self, arguments: Sequence[Sequence[Buffer]],
                non_donatable: set[int]) -> list[list[Buffer]]:
        """Run on one argument list per device; returns one result list per device, and
        deletes the donated arguments (as PJRT does; `non_donatable`: argument positions
        the caller keeps)."""
        count = len(self.arg_slots)
        for d, row in enumerate(arguments):
            if len(row) != count:
                raise ValueError(f"device {d} got {len(row)} arguments; the program takes "
                                 f"{count}")
        donated = [i for i in self.donated if i not in non_donatable]
        for d, row in enumerate(arguments):
            donation.check_used_once(row, donated,
                                     lambda k, d=d: f"flattened argument {k} of device {d}")
        self.loaded.prefetch_workspace()  # a first call's: made while arguments assemble
        results = self.loaded.run([self._argument(i, [row[k] for row in arguments])
                                   for k, i in enumerate(self.arg_slots) if i is not None])
        sizes = self._mesh_sizes()
        per_device: list[list[Buffer]] = [[] for _ in self.devices]
        for i, kind in zip(self.result_slots, self.out_memory_kinds, strict=True):
            if i is None:  # a token, as XLA gives (no data)
                for d, device in enumerate(self.devices):
                    per_device[d].append(Buffer(_TOKEN, device, device.memory(kind),
                                                token=True))
                continue
            host = sharding.on_host(results[i])  # a view of the simulator's result
            partials = _at(self.out_partials, i)
            if i in self.chip_outputs:
                layout = self._layout(self.out_layouts, i, host.ndim - len(sizes))
                whole = Whole(layout, sizes, chips=host)
                pieces = sharding.device_pieces(host, sizes)
            else:
                whole = Whole(self._layout(self.out_layouts, i, host.ndim), sizes, results[i])
                pieces = sharding.pieces(host, whole.layout, sizes)
            for d, piece in enumerate(pieces):
                device = self.devices[d]
                per_device[d].append(Buffer(piece.reshape(piece.shape[partials:]), device,
                                            device.memory(kind), whole, d))
        for row in arguments:
            donation.delete_donated(row, donated)
        return per_device

    def _layout(self, layouts: tuple, i: int, ndim: int) -> tuple:
        """dim_axes of leaf i (replicated: no axes per dim)."""
        given = layouts[i] if i < len(layouts) else None
        return given if given is not None else ((),) * ndim

    def _argument(self, i: int, pieces: list[Buffer]) -> Any:
        """Argument i as a global array from its per-device pieces. Pieces of one global
        array laid out as the program takes it are that array; others are assembled (and
        their replicas compared) once: the buffers then share the assembled array."""
        sizes = self._mesh_sizes()
        partials = _at(self.in_partials, i)
        layout = self._layout(self.in_layouts, i, partials + pieces[0].data().ndim)
        whole = pieces[0].whole
        if whole is not None and (whole.layout, whole.sizes) == (layout, sizes) and all(
                p.whole is whole and p.index == d for d, p in enumerate(pieces)):
            return whole.value
        # a value unreduced along some axes: each piece one partial sum, stacked
        stacked = [p.data().reshape((1,) * partials + p.data().shape) for p in pieces]
        try:
            value = sharding.assemble(stacked, layout, sizes)
        except ValueError as e:
            raise ValueError(f"{self.loaded.arg_names[i]}: {e}") from None
        whole = Whole(layout, sizes, value)
        for d, (piece, view) in enumerate(zip(pieces, sharding.pieces(value, layout, sizes))):
            piece.share(view.reshape(view.shape[partials:]), whole, d)
        return value

    def _mesh_sizes(self) -> tuple[int, ...]:
        return self.loaded.program.mesh.axis_sizes or (len(self.devices),)

    # --- what jaxlib asks of a compiled program ----------------------------------------------

    @property
    def num_outputs(self) -> int:
        return len(self.result_slots)

    def output_types(self) -> list[tuple[np.dtype | None, tuple[int, ...]]]:
        """(dtype, per-device shape) of each output ((None, ()) for a token)."""
        from mesh import dtypes
        program = self.loaded.program
        out = []
        for i in self.result_slots:
            if i is None:
                out.append((None, ()))
                continue
            t = program.values[program.outputs[i]].type
            layout = self._layout(self.out_layouts, i, len(t.shape))
            local = sharding.local_shape(t.shape, layout, self._mesh_sizes())
            out.append((dtypes.numpy_dtype(t.dtype), local[_at(self.out_partials, i):]))
        return out

    def optimized_program(self) -> bytes:
        """An HloModuleProtoWithConfig of one device's program, with the layouts of its
        arguments and results over the devices (jax reads the output shardings from it):
        the per-chip module XLA's partitioner made, for a program it partitioned."""
        if self._optimized is None:
            from jax_trn2.plugin.signature import signature_module
            from lowering import partitioned_module
            self._optimized = signature_module(self, self.loaded.module,
                                               partitioned_module(self.loaded.module))
        return self._optimized

    def cost_analysis(self) -> dict[str, Any]:
        """The estimate's cost_analysis, its nested entries flattened to 'trn2.key.subkey'
        (PJRT's named values are flat)."""
        return _flat(self.loaded.cost_analysis())

    def memory_stats(self) -> Any:
        return self.loaded.memory_analysis()

    def serialize(self) -> bytes:
        """The program and its compile options (a deserialized executable is compiled again
        from them: the simulator's compile is its lowering)."""
        return _SERIALIZED_MAGIC + protobuf.field_bytes(1, self.code) + \
            protobuf.field_bytes(2, self.compile_options)


def _chips(topology: Topology, devices: Sequence[Device]) -> list[int]:
    """The machine device (chip, or logical core) of `topology` each device runs on:
    device i is the i-th in device_order (a chip's cores consecutive, then the chips with
    the fastest links innermost), its own on the client's machine, and the same position
    on the machine a program's trn2_topology names."""
    order = device_order(topology)
    outside = [d.id for d in devices if d.id >= len(order)]
    if outside:
        raise ValueError(f"devices {outside} have no {topology.device_kind} on "
                         f"'{topology.name}' ({len(order)} {topology.device_kind}s): run the "
                         f"program on devices 0..{len(order) - 1} of jax.devices('trn2')")
    return [order[d.id] for d in devices]


def of(compiled: Any) -> Executable:
    """The plugin's executable behind a jax `Compiled` (jax.jit(f).lower(...).compile()) of
    the trn2 platform, found by its fingerprint."""
    fingerprint = compiled.runtime_executable().fingerprint
    if isinstance(fingerprint, bytes):
        fingerprint = fingerprint.decode()
    executable = _LIVE.get(fingerprint or "")
    if executable is None:
        raise ValueError(f"not a program compiled by the trn2 plugin (it was compiled for "
                         f"{_platforms_text(compiled)}): compile it for jax.devices('trn2')")
    return executable


def _platforms_text(compiled: Any) -> str:
    """`the cpu platform`: where a jax Compiled's arguments and results are."""
    import jax
    shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
    platforms = sorted({d.platform for s in shardings for d in s.device_set})
    return f"the {' and '.join(platforms)} platform" if platforms else "no device"


class View:
    """A PJRT_Executable: what LoadedExecutable_GetExecutable hands out, destroyed on its own
    (jaxlib destroys it apart from the loaded executable)."""

    def __init__(self, executable: Executable):
        self.executable = executable


def deserialize(client: Any, data: bytes, compile_options: bytes | None) -> Executable:
    if not data.startswith(_SERIALIZED_MAGIC):
        raise ValueError("not an executable serialized by the jax-trn2 plugin")
    parts = dict(protobuf.fields(data[len(_SERIALIZED_MAGIC):]))
    return Executable(client, parts[1], compile_options or parts[2])


# The data of a token result (of an ordered effect, or lax.create_token's), which holds
# none; the simulator makes its tokens inside a program, and runs in order anyway.
_TOKEN = np.zeros(0, np.bool_)
_TOKEN.flags.writeable = False


def _slots(values: Sequence[Any]) -> list[int | None]:
    """For each of main's arguments (or results), its position among the program's inputs
    (or outputs), None for a token (which the program neither takes nor gives)."""
    from lowering import mlir
    slots, position = [], 0
    for value in values:
        slots.append(None if mlir.is_token(value.type) else position)
        position += not mlir.is_token(value.type)
    return slots


def _at(partials: tuple, i: int) -> int:
    """How many leading dims of program input or output i stack partial sums
    (isa.Program.input_partials: none for a program that has none)."""
    return partials[i] if i < len(partials) else 0


def _module_name(module: Any) -> str:
    from jaxlib.mlir import ir
    attrs = module.operation.attributes
    return ir.StringAttr(attrs["sym_name"]).value if "sym_name" in attrs else "main"


def _flat(values: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif isinstance(value, (np.integer, np.floating, np.bool_)):
            out[name] = value.item()
        elif value is None:
            continue
        else:
            out[name] = str(value)
    return out


def _refuse_other_processes_devices(devices: Sequence[Device], process_index: int) -> None:
    """A program on devices of several jax.distributed processes needs their values to
    cross processes, which the simulator does not do yet: an error that says so, at
    compile time (a program on this process's own devices runs as on one process)."""
    others = sorted({d.process_index for d in devices} - {process_index})
    if others:
        raise NotImplementedError(
            f"this trn2 program runs on devices of process(es) {others} as well as this one's "
            f"({process_index}): a simulation across jax.distributed processes is not "
            "supported yet. Run it on this process's devices (jax.local_devices(backend="
            "'trn2')), in one process, or with jax_trn2.jit(f, executor_devices="
            "jax.devices()): one simulation over the devices of every process.")
