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

A program over the devices of several jax.distributed processes runs as one simulation over
one CPU device of each: process p computes a block of the chips (those of its own devices,
where the devices of each process are a block of the mesh, as jax.make_mesh lays out
jax.devices("trn2")). No process holds an argument or a result whole unless its chips need
it whole: it gives the simulation the parts of each argument its chips read, made from its
own devices' pieces (an argument its devices do not hold those parts of is moved between
the processes first, and made whole), and the simulation leaves each result split so that
each process's part holds its own devices' pieces (whole on each where every process needs
it whole: a replicated result), of which their buffers are views.
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from typing import Any, Sequence

import numpy as np
from jax._src.lib import xla_client

from jax_trn2.core import donation, lowerings, options
from jax_trn2.plugin import abi, proto
from jax_trn2.plugin.handles import Buffer, Device, Whole
from lowering import memory_layouts, protobuf
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
        # positions in self.devices of this process's devices (under jax.distributed, the
        # others' are other processes'): PJRT's Execute takes and gives theirs alone
        self.local = [d for d, device in enumerate(self.devices) if device.addressable]
        self.loaded = LoadedExecutable.from_stablehlo(
            self.options.topology, self.code, rounding=self.options.rounding,
            executor_devices=_executor_devices(self.devices),
            device_assignment=_chips(self.options.topology, self.devices),
            host_callbacks=lowerings.CALLBACKS)
        self.in_layouts, self.out_layouts = self.loaded.layouts
        program = self.loaded.program
        # the devices' buffers of these are views of their chips' pieces
        self.chip_outputs = set(chip_outputs(program, self.out_layouts))
        self.loaded.return_chip_pieces(sorted(self.chip_outputs))
        if self.loaded.spans_processes:  # each process keeps its own devices' pieces
            self.loaded.place_results(self._placed_on_processes())
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
        # the order of each parameter's and result's elements in its buffers
        # (mesh.memory_layout)
        self.parameter_memory_layouts, self.output_memory_layouts = \
            memory_layouts.main_layouts(module)
        self.name = _module_name(module)
        self.fingerprint = hashlib.sha256(self.code + self.compile_options).hexdigest()
        self.owned = abi.Owned()
        self.deleted = False
        _LIVE[self.fingerprint] = self

    # --- running ---------------------------------------------------------------------------

    @property
    def addressable_devices(self) -> list[Device]:
        """This process's devices of the program, those Execute takes and gives buffers of."""
        return [self.devices[d] for d in self.local]

    def execute(self, arguments: Sequence[Sequence[Buffer]],
                non_donatable: set[int]) -> list[list[Buffer]]:
        """Run on one argument list per addressable device; returns one result list per
        addressable device, and deletes the donated arguments (as PJRT does;
        `non_donatable`: argument positions the caller keeps). A program over the devices
        of several processes runs in each of them at once (each process's jax calls it:
        multi-controller), as one simulation over their CPU devices."""
        if len(arguments) != len(self.local):
            raise ValueError(f"got argument lists for {len(arguments)} devices; the program "
                             f"runs on {len(self.local)} devices of this process")
        if not self.local:  # other processes' devices alone: they run it, without this one
            return []
        count = len(self.arg_slots)
        for d, row in enumerate(arguments):
            if len(row) != count:
                raise ValueError(f"device {d} got {len(row)} arguments; the program takes "
                                 f"{count}")
        self._check_layouts(arguments[0])
        donated = [i for i in self.donated if i not in non_donatable]
        for d, row in enumerate(arguments):
            donation.check_used_once(row, donated,
                                     lambda k, d=d: f"flattened argument {k} of device {d}")
        self.loaded.prefetch_workspace()  # a first call's: made while arguments assemble
        results = self.loaded.run(self._arguments(arguments))
        per_device: list[list[Buffer]] = [[] for _ in self.local]
        for i, kind, layout in zip(self.result_slots, self.out_memory_kinds,
                                   self.output_memory_layouts, strict=True):
            if i is None:  # a token, as XLA gives (no data)
                for row, device in zip(per_device, self.addressable_devices):
                    row.append(Buffer(_TOKEN, device, device.memory(kind), token=True))
                continue
            partials = _at(self.out_partials, i)
            pieces, whole = self._result_pieces(i, results[i])
            for row, d in zip(per_device, self.local):
                device, piece = self.devices[d], pieces[d]
                row.append(Buffer(piece.reshape(piece.shape[partials:]), device,
                                  device.memory(kind), whole, d, memory_layout=layout))
        for row in arguments:
            donation.delete_donated(row, donated)
        return per_device

    def _check_layouts(self, row: Sequence[Buffer]) -> None:
        """ValueError naming the first of the first device's arguments (`row`) laid out
        otherwise than the program was compiled for, as PJRT refuses it: the program would
        read its bytes in another order (jax lays an argument out as the program takes it
        before it calls; mesh.memory_layout). The other devices' buffers of an argument are
        pieces of the same jax array, in its one layout, and are not checked: checking
        each would cost a call on 64 devices about 100 us (8 arguments)."""
        for k, (buffer, layout) in enumerate(zip(row, self.parameter_memory_layouts)):
            if self.arg_slots[k] is not None and buffer.memory_layout != layout:
                raise ValueError(
                    f"argument {k} ({buffer}) is laid out with "
                    f"major_to_minor={buffer.memory_layout}, but the program was compiled for "
                    f"major_to_minor={layout}: put it in that layout first "
                    "(jax.device_put(x, Format(Layout(major_to_minor=...), sharding)))")

    def _result_pieces(self, i: int, result: Any) -> tuple[Any, Whole | None]:
        """The pieces of output i (by device position: views of the simulator's result), and
        the Whole they share: over several processes, those of this process's devices
        alone, cut from its own shards of the result (_placed_on_processes), with no
        Whole (no process holds the global array)."""
        sizes = self._mesh_sizes()
        if self.loaded.spans_processes:
            regions = self._result_regions(i, result.shape)
            pieces = {d: _own_part(result, regions[d]) for d in self.local}
            if i in self.chip_outputs:  # a chip's piece, without the mesh dims
                pieces = {d: p.reshape(p.shape[len(sizes):]) for d, p in pieces.items()}
            return pieces, None
        host = sharding.on_host(result)  # a view of the simulator's result
        if i in self.chip_outputs:
            layout = self._layout(self.out_layouts, i, host.ndim - len(sizes))
            return sharding.device_pieces(host, sizes), Whole(layout, sizes, chips=host)
        whole = Whole(self._layout(self.out_layouts, i, host.ndim), sizes, result)
        return sharding.pieces(host, whole.layout, sizes), whole

    def _result_regions(self, i: int, shape: tuple[int, ...]) -> list[sharding.Region]:
        """Per device position, where its piece of output i lies in the simulator's result
        of `shape`: its chip's piece among the chips' (a chip output), else its block of
        the global array by the output's layout."""
        sizes = self._mesh_sizes()
        if i in self.chip_outputs:
            return sharding.chip_regions(shape, sizes)
        return sharding.block_regions(shape, self._layout(self.out_layouts, i, len(shape)),
                                      sizes)

    def _placed_on_processes(self) -> list[Any]:
        """Where a run over the CPU devices of several processes (one each) leaves each
        result: split over them so that each process's shard holds its own devices'
        pieces, else (a piece every process's devices need, a replicated result) whole on
        each (mesh.executor.split_covering). No process then gathers the others' pieces."""
        from mesh.executor import split_covering
        executors = self.loaded.executor_devices
        owners = [device.process_index for device in self.devices]
        placed = []
        for i, shape in enumerate(self.loaded.result_shapes):
            regions = self._result_regions(i, shape)
            needs = [[r for r, owner in zip(regions, owners) if owner == cpu.process_index]
                     for cpu in executors]
            placed.append(split_covering(executors, shape, needs))
        return placed

    def _layout(self, layouts: tuple, i: int, ndim: int) -> tuple:
        """dim_axes of leaf i (replicated: no axes per dim)."""
        given = layouts[i] if i < len(layouts) else None
        return given if given is not None else ((),) * ndim

    def _arguments(self, arguments: Sequence[Sequence[Buffer]]) -> list[Any]:
        """The program's arguments as global arrays, from this process's devices' buffers
        (one row per device of self.local); over several processes, with the pieces of the
        other processes' devices that it needs (_add_other_processes_pieces)."""
        slots = [(k, i) for k, i in enumerate(self.arg_slots) if i is not None]
        pieces = {i: dict(zip(self.local, (row[k] for row in arguments))) for k, i in slots}
        if self.loaded.spans_processes:
            return self._arguments_over_processes(pieces)
        return [self._argument(i, pieces[i]) for _, i in slots]

    def _arguments_over_processes(self, pieces: dict[int, dict[int, Any]]) -> list[Any]:
        """The program's arguments (`pieces`: of each, this process's devices' pieces by
        device position) for a run over the CPU devices of several processes: global
        arrays of which each process gives the parts its chips read
        (LoadedExecutable.argument_shardings), made from its own devices' pieces where
        those hold them (no other process's then moves); the others whole, from every
        process's pieces (_add_other_processes_pieces). Every process decides alike (by
        the layouts and which process holds which device)."""
        moved = {i: by_device for i, by_device in pieces.items()
                 if not self._own_pieces_suffice(i, by_device)}
        if moved:
            self._add_other_processes_pieces(moved)
        return [self._argument(i, by_device) if i in moved else self._own_parts(i, by_device)
                for i, by_device in pieces.items()]

    def _argument_regions(self, i: int, by_device: dict[int, Any]) -> list[sharding.Region]:
        """Per device position, where its piece of argument i lies in the global array."""
        return sharding.block_regions(self._argument_shape(i),
                                      self._argument_layout(i, by_device), self._mesh_sizes())

    def _argument_shape(self, i: int) -> tuple[int, ...]:
        program = self.loaded.program
        return program.values[program.inputs[i]].type.shape

    def _own_pieces_suffice(self, i: int, by_device: dict[int, Any]) -> bool:
        """Whether the devices of every process hold, between them, the part of argument
        i that process's chips read (LoadedExecutable.argument_shardings)."""
        shape, regions = self._argument_shape(i), self._argument_regions(i, by_device)
        target = self.loaded.argument_shardings[i]
        for cpu, part in target.devices_indices_map(shape).items():
            held = {_key(r, shape): r for r, device in zip(regions, self.devices)
                    if device.process_index == cpu.process_index}.values()
            common = (sharding.overlap(r, part, shape) for r in held)
            if sum(sharding.region_size(c, shape) for c in common if c is not None) != \
                    sharding.region_size(part, shape):
                return False
        return True

    def _own_parts(self, i: int, by_device: dict[int, Any]) -> Any:
        """Argument i as a global array over the executor devices, this process's parts
        of it (those its chips read) copied from its own devices' pieces (a piece that is
        a whole part goes as it is)."""
        import jax
        shape, regions = self._argument_shape(i), self._argument_regions(i, by_device)
        partials = _at(self.in_partials, i)
        target = self.loaded.argument_shardings[i]
        parts = []
        for cpu, part in target.addressable_devices_indices_map(shape).items():
            held = {}  # each block once (devices holding copies of it give one)
            for d, piece in by_device.items():
                common = sharding.overlap(regions[d], part, shape)
                if common is not None:
                    data = _data(piece)
                    held[_key(regions[d], shape)] = (common, regions[d],
                                                     data.reshape((1,) * partials + data.shape))
            blocks = list(held.values())
            if len(blocks) == 1 and sharding.region_size(blocks[0][0], shape) == \
                    sharding.region_size(part, shape):  # the part lies in one block
                common, region, data = blocks[0]
                block = data[sharding.relative(common, region, shape)]
            else:
                block = np.empty([stop - start for start, stop in sharding.bounds(part, shape)],
                                 _data(next(iter(by_device.values()))).dtype)
                for common, region, data in blocks:
                    block[sharding.relative(common, part, shape)] = \
                        data[sharding.relative(common, region, shape)]
            with jax.enable_x64(True):  # a 64-bit argument keeps its type
                parts.append(jax.device_put(block, cpu))
        with jax.enable_x64(True):
            return jax.make_array_from_single_device_arrays(shape, target, parts)

    def _argument(self, i: int, pieces: dict[int, Buffer | np.ndarray]) -> Any:
        """Argument i as a global array from its pieces by device position (this
        process's buffers, and other processes' pieces as arrays). Buffers of one global
        array laid out as the program takes it are that array; others are assembled (and
        their replicas compared) once: the buffers then share the assembled array."""
        sizes = self._mesh_sizes()
        partials = _at(self.in_partials, i)
        own = {d: p for d, p in pieces.items() if isinstance(p, Buffer)}
        if self._held_whole(i, own):
            return next(iter(own.values())).whole.value
        layout = self._argument_layout(i, pieces)
        # a value unreduced along some axes: each piece one partial sum, stacked
        stacked = [_data(pieces[d]) for d in range(len(self.devices))]
        stacked = [p.reshape((1,) * partials + p.shape) for p in stacked]
        try:
            value = sharding.assemble(stacked, layout, sizes)
        except ValueError as e:
            raise ValueError(f"{self.loaded.arg_names[i]}: {e}") from None
        whole = Whole(layout, sizes, value)
        views = sharding.pieces(value, layout, sizes)
        for d, piece in own.items():
            piece.share(views[d].reshape(views[d].shape[partials:]), whole, d)
        return value

    def _add_other_processes_pieces(self, pieces: dict[int, dict[int, Any]]) -> None:
        """Complete each argument's pieces (by device position) with those of the other
        processes' devices: copies of this process's own where its devices hold every
        block of the value (a replicated argument), else theirs, moved by jax's
        collectives from the processes that hold them. Every process decides alike (by
        the layouts, and by what every process says it lacks), so that each runs the
        same collectives."""
        owners = [device.process_index for device in self.devices]
        blocks = {i: self._blocks(i, pieces[i]) for i in pieces}
        uncovered = [i for i in pieces
                     if not _every_process_holds_every_block(blocks[i], owners)]
        if uncovered:
            # an argument every process holds whole (a result of the last run) moves not
            lacks = np.array([not self._held_whole(i, pieces[i]) for i in uncovered])
            lacking = self.loaded.from_every_process(lacks).any(axis=0)
            moved = [i for i, lack in zip(uncovered, lacking) if lack]
            if moved:
                self._move_pieces(moved, pieces, owners)
        for i, by_device in pieces.items():  # (an argument held whole needs no others)
            mine = {blocks[i][d]: _data(p) for d, p in by_device.items()}
            for d in range(len(self.devices)):
                if d not in by_device and blocks[i][d] in mine:
                    by_device[d] = mine[blocks[i][d]]

    def _argument_layout(self, i: int, by_device: dict[int, Any]) -> tuple:
        """dim_axes of argument i (a dim first for each dim of stacked partial sums), of
        which `by_device` holds pieces."""
        some = _data(next(iter(by_device.values())))
        return self._layout(self.in_layouts, i, _at(self.in_partials, i) + some.ndim)

    def _blocks(self, i: int, by_device: dict[int, Any]) -> list[tuple[int, ...]]:
        """Per device position, the block of argument i its piece is (mesh.sharding)."""
        return sharding.device_blocks(self._argument_layout(i, by_device), self._mesh_sizes())

    def _held_whole(self, i: int, by_device: dict[int, Buffer]) -> bool:
        """Whether this process's buffers of argument i (by device position) are pieces of
        a global array it holds, laid out as the program takes it."""
        whole = next(iter(by_device.values())).whole
        return whole is not None and (whole.layout, whole.sizes) == (
            self._argument_layout(i, by_device), self._mesh_sizes()) and all(
            p.whole is whole and p.index == d for d, p in by_device.items())

    def _move_pieces(self, moved: list[int], pieces: dict[int, dict[int, Any]],
                     owners: list[int]) -> None:
        """Add the other processes' pieces of arguments `moved` to `pieces`, in one
        collective: each process gives a row of bytes, its devices' pieces of each
        argument in device order (as many as the process with the most devices has,
        zeros after its own)."""
        per_process = max(owners.count(p) for p in set(owners))
        mine = []
        for i in moved:
            local = [_data(pieces[i][d]) for d in self.local]
            rows = np.zeros((per_process, local[0].nbytes), np.uint8)
            for row, piece in zip(rows, local):
                row[:] = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
            mine.append(rows.reshape(-1))
        every = self.loaded.from_every_process(np.concatenate(mine))
        by_process = {p: [d for d, o in enumerate(owners) if o == p] for p in set(owners)}
        offset = 0
        for i in moved:
            template = _data(pieces[i][self.local[0]])
            size = template.nbytes
            for row, p in zip(every, sorted(by_process)):
                for k, d in enumerate(by_process[p]):
                    if d not in pieces[i]:
                        start = offset + k * size
                        pieces[i][d] = row[start:start + size].view(template.dtype).reshape(
                            template.shape)
            offset += per_process * size

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

    @functools.cached_property
    def partitioned(self) -> Any:
        """The per-chip module XLA's partitioner made of the program (None for a program
        it did not partition), as lowering remembers it."""
        from lowering import partitioned_module
        return partitioned_module(self.loaded.module)

    @functools.cached_property
    def shardings(self) -> tuple[list[str], list[str]]:
        """The HloShardings (XLA's text) of the parameters and results over the devices."""
        from jax_trn2.plugin.signature import shardings
        return shardings(self, self.partitioned)

    @functools.cached_property
    def op_shardings(self) -> tuple[list[bytes], list[bytes]]:
        """`shardings` as serialized OpShardings, what PJRT's shardings extension gives
        jaxlib (which then needs no optimized program to learn them)."""
        from jax_trn2.plugin.signature import op_sharding
        return tuple([op_sharding(s) for s in kind] for kind in self.shardings)

    @functools.cached_property
    def optimized_program(self) -> bytes:
        """An HloModuleProtoWithConfig of one device's program, with the layouts of its
        arguments and results over the devices: the per-chip module XLA's partitioner
        made, for a program it partitioned (`compiled.as_text()` shows it). Made when
        first asked for: it takes jaxlib's converter milliseconds a program."""
        from jax_trn2.plugin.signature import signature_module
        return signature_module(self, self.loaded.module, self.partitioned)

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


def _data(piece: Buffer | np.ndarray) -> np.ndarray:
    return piece.data() if isinstance(piece, Buffer) else piece


def _key(region: sharding.Region, shape: tuple[int, ...]) -> tuple:
    """A region as a dict key (slices are not hashable)."""
    return tuple(sharding.bounds(region, shape))


def _own_part(result: Any, region: sharding.Region) -> np.ndarray:
    """`region` of a global array over the CPU devices of several processes: a view of
    this process's shard that holds it."""
    shape = result.shape
    for shard in result.addressable_shards:
        if sharding.contains(shard.index, region, shape):
            held = np.asarray(shard.data)
            within = sharding.relative(region, shard.index, shape)
            return held[within] if within else held
    raise RuntimeError(f"no shard of this process holds {region} of the result "
                       f"{result.shape}: the run left it on {result.sharding}")


def _every_process_holds_every_block(blocks: list[tuple[int, ...]], owners: list[int]) -> bool:
    """Whether the devices of each process (`owners`: per device position, its process)
    hold every block of a value (`blocks`: per device position, its block)."""
    every = set(blocks)
    return all({b for b, o in zip(blocks, owners) if o == p} == every for p in set(owners))


def _executor_devices(devices: Sequence[Device]) -> list[Any] | None:
    """Where the simulation of a program on `devices` runs: for devices of several
    jax.distributed processes, one CPU device of each of those processes (one computation
    over them, as jax_trn2.jit's executor_devices runs it: process p computes the p-th
    block of the chips, with all its cores, XLA:CPU's threads); else the simulator's own
    (None)."""
    owners = sorted({d.process_index for d in devices})
    if len(owners) == 1:  # run by that process alone (any other has none of its devices)
        return None
    import jax
    cpus: dict[int, Any] = {}
    try:
        for cpu in jax.devices("cpu"):
            cpus.setdefault(cpu.process_index, cpu)
    except RuntimeError:  # JAX_PLATFORMS without cpu: no CPU backend
        pass
    missing = [p for p in owners if p not in cpus]
    if missing:
        raise ValueError(f"this trn2 program runs on devices of processes {owners}, but "
                         f"jax's CPU backend has no devices of processes {missing}: the "
                         "simulation of a program across processes runs on their CPU devices "
                         "(jax.distributed.initialize before jax starts its backends, with "
                         "jax_cpu_collectives_implementation 'gloo' or 'mpi', and 'cpu' in "
                         "JAX_PLATFORMS if it is set)")
    return [cpus[p] for p in owners]


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
