"""LoadedExecutable: a compiled Trn2 program, run on the simulated mesh."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import weakref
from functools import cached_property, lru_cache
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax._src import config, core
from jax._src import mesh as mesh_lib
from jax._src.interpreters import mlir as jax_mlir
from jax.sharding import NamedSharding, SingleDeviceSharding

import lowering
from jax_trn2.core import watchers
from jax_trn2.core.device import Buffer, Device
from jax_trn2.core.machines import PROCESS_GRID_AXES, placement_for, topology_for
from jax_trn2.core.processes import ProcessLostError, lost_processes, runtime_failure, \
    stacked_over_processes, wait_for_run
from lowering import mlir, partition
from lowering.host import host_devices
from lowering.plan import plan_program
from mesh import dtypes, isa, numerics, optimization_level, sharding
from mesh.isa import printer
from mesh.isa.control import ControlFlow
from mesh.isa.content import program_key
from mesh.perf import trace
from mesh.perf.estimate import ProgramEstimate, target_text
from mesh.emulated_floats import host_to_storage, storage_to_host
from mesh.executor import as_input, compile_program, input_dtype, input_shapes, \
    output_shapes, output_unshard, read_sharding, runs_on_cpu, split_over, \
    with_chip_outputs, workspace_values
from mesh.isa.kernels.participation import SplitGroupCheck
from mesh.machine import Placement, Topology, place_on
from mesh.memory import MemoryStats, bytes_bound


def python_scalar(name: str, value: bool | int | float | complex,
                  expected: isa.TensorType) -> np.ndarray:
    """A Python scalar as a value of the parameter's type, when it fits that type: TypeError
    naming the argument for a value the conversion would change (a fraction or an
    out-of-range number for an integer or bool parameter, a complex for a real one) rather
    than a silently different number. Floats round to the parameter's precision, and
    overflow to infinity, as they do under jax.jit."""
    dtype = dtypes.numpy_dtype(expected.dtype)
    if isinstance(value, complex) and not jnp.issubdtype(dtype, np.complexfloating):
        fits = False
    elif jnp.issubdtype(dtype, np.integer) or jnp.issubdtype(dtype, np.bool_):
        whole = not isinstance(value, float) or float(value).is_integer()
        low, high = (0, 1) if jnp.issubdtype(dtype, np.bool_) else \
            (int(ml_dtypes.iinfo(dtype).min), int(ml_dtypes.iinfo(dtype).max))
        fits = whole and low <= value <= high
    else:  # floating: rounds to the type's precision (1e300 is inf in FP32, as in jax)
        fits = True
    if not fits:
        raise TypeError(f"{name}: the Python {type(value).__name__} {value!r} does not fit "
                        f"the parameter's type {expected} (the program was compiled for "
                        f"{expected.dtype}); pass a value of that type or recompile for this one")
    with np.errstate(over="ignore"):
        return np.asarray(value, dtype=dtype)


class HostMemoryError(MemoryError):
    """The host ran out of memory running the simulation (not the chips: their HBM use is
    memory_analysis()'s, and compile() checks it)."""


# jax's accelerator backends, where the simulation runs on jax's default device.
_ACCELERATORS = ("cuda", "rocm", "gpu", "tpu")

# Makes a program's first workspace while its executor compiles (prefetch_workspace).
_BACKGROUND = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="jax_trn2-workspace")


@contextlib.contextmanager
def _executor_context():
    """Where the simulation's own computations are compiled and run: at jax's top level,
    with 64-bit types (a module's 64-bit values keep their type), and on the executor's
    devices rather than over a mesh the caller set with jax.set_mesh (under which jax
    would compile and run them replicated on every device of that mesh, each doing all the
    work), unseen by what the caller installed to watch jax's work (jax's test-event
    listener, a replacement of its lowering of jaxprs: jax_trn2.core.watchers), and
    compiled even under jax.disable_jit (which is for stepping through the user's Python;
    the simulator's computations are not the user's and run only compiled), and moving
    their arrays to and from the executor's devices under a jax.transfer_guard the caller
    set (which guards the user's transfers to the chips, not the simulator's own on the
    host).

    Each setting is changed only where the caller's differs: entering one costs 1 to 17
    microseconds (the transfer guard's four settings most) on every run, where a small
    program's run takes tens."""
    with contextlib.ExitStack() as stack:
        if not core.trace_state_clean():
            stack.enter_context(_top_level())
        if not (mesh_lib.get_abstract_mesh().empty and mesh_lib.get_concrete_mesh().empty):
            stack.enter_context(jax.set_mesh(None))
        if not config.enable_x64.value:
            stack.enter_context(jax.enable_x64(True))
        if config.disable_jit.value:
            stack.enter_context(jax.disable_jit(False))
        if any(guard.value not in (None, "allow") for guard in _TRANSFER_GUARDS):
            stack.enter_context(jax.transfer_guard("allow"))
        if watchers.installed():
            stack.enter_context(watchers.unwatched())
        yield


# The transfer guard's settings: all transfers', and each direction's (which override it);
# unset (None) is "allow".
_TRANSFER_GUARDS = (config._transfer_guard, config.transfer_guard_host_to_device,
                    config.transfer_guard_device_to_device,
                    config.transfer_guard_device_to_host)


# jax's maker of the MLIR context of each module it lowers (a new one each time), and
# which threads lower the executor's computation in lowering.mlir's shared context
# instead: .size, the bytes of the program's constants (None: jax's own).
_JAX_MAKE_IR_CONTEXT = jax_mlir.make_ir_context
_SHARED_CONTEXT = threading.local()


def _make_ir_context() -> Any:
    size = getattr(_SHARED_CONTEXT, "size", None)
    return _JAX_MAKE_IR_CONTEXT() if size is None else mlir.shared_context(size)


@contextlib.contextmanager
def _lowered_in_shared_context(program: isa.Program):
    """jax's lowering of the executor's computation of `program` in this thread, in the MLIR
    context lowering.mlir shares between modules (about 3 ms a program, a third of a small
    program's trace and lowering, is jax making a new one). jax has no API for the context
    jit lowers in: its maker is replaced in place (once), and makes jax's own context
    outside the block and in other threads; where someone else replaced it, it is left
    alone."""
    if jax_mlir.make_ir_context is _JAX_MAKE_IR_CONTEXT:
        jax_mlir.make_ir_context = _make_ir_context
    if jax_mlir.make_ir_context is not _make_ir_context:
        yield
        return
    _SHARED_CONTEXT.size = _constant_bytes(program)  # what its module interns, at least
    try:
        yield
    finally:
        _SHARED_CONTEXT.size = None


def _constant_bytes(program: isa.Program) -> int:
    """The bytes of the constants of `program` and its sub-programs."""
    return sum(instr.value.nbytes if isinstance(instr, isa.Constant) else
               sum(_constant_bytes(sub) for _, sub in instr.regions())
               if isinstance(instr, ControlFlow) else 0
               for instr in program.instructions)


@contextlib.contextmanager
def _top_level():
    """jax's trace state as outside every transformation. A program runs while the caller
    may be inside one: jax runs a shard_map not under jit op by op, each op a program for
    the plugin, inside the shard_map's trace and axis names; a jax_trn2.jit function under
    `jax.vmap(..., axis_name=...)` runs in the vmap's axis names. The simulator's own
    computations belong to neither (and jax.set_mesh is refused inside them). jax has no
    public API for this (jax._src.core)."""
    outer = core.trace_ctx.axis_env
    core.trace_ctx.set_axis_env(core.top_axis_env)
    try:
        with core.take_current_trace():
            yield
    finally:
        core.trace_ctx.set_axis_env(outer)


def _placement(topology: Topology, mesh: isa.MeshSpec,
               device_assignment: Sequence[int] | None) -> Placement | None:
    """Where each logical device of `mesh` sits: on the chips of `device_assignment`, else
    where placement_for puts it. A program without a mesh is the same program on any chip
    (the model runs it as chip 0): its assigned chip need only exist."""
    if device_assignment is None:
        return placement_for(topology, mesh.axis_sizes, mesh.axis_names)
    if mesh.axis_sizes:
        return place_on(topology, mesh.axis_sizes, mesh.axis_names, device_assignment)
    outside = [c for c in device_assignment if not 0 <= c < topology.num_devices]
    if outside:
        what = "chip" if topology.lnc is None else "device"
        raise ValueError(f"{what}s {outside} are not {what}s of '{topology.name}' ({what} ids "
                         f"0..{topology.num_devices - 1}): run the program on one of those")
    return None


def _global_input(array: Any, sharding: NamedSharding) -> Any:
    """An argument of a run over the devices of several processes, where its computation
    takes it (`sharding`): a host array as it is (each process gives its devices' slices
    of it; it is the same in every process), as is a global array laid out so; one laid
    out otherwise is moved there by jax, between the processes (as jax.jit moves an
    argument); one on this process's devices alone is this process's copy, read here."""
    if not isinstance(array, jax.Array):
        return array
    if array.is_fully_addressable:
        return np.asarray(array)
    if array.sharding.is_equivalent_to(sharding, array.ndim):
        return array
    return jax.device_put(array, sharding)


@lru_cache(maxsize=64)
def _zeros_maker(types: tuple[jax.ShapeDtypeStruct, ...], device: jax.Device | None) -> Any:
    """A function making zeroed arrays of `types` on `device` (None: jax's default device;
    jnp.zeros would make them there and put them on `device`, as buffers XLA cannot take
    over), one per workspace layout: an executable of a program compiled before (see
    _COMPILED_RUNS) traces and lowers nothing for it either."""
    on = dict(out_shardings=SingleDeviceSharding(device)) if device is not None else {}
    return jax.jit(lambda: [jnp.zeros(t.shape, t.dtype) for t in types], **on)


class _CompiledRun:
    """A program's computation for the executor (a jax Compiled) and the checks traced
    into it (mesh.isa.kernels.participation), which report on its runs."""

    def __init__(self, compiled: jax.stages.Compiled, split_check: SplitGroupCheck):
        self.compiled = compiled
        self.split_check = split_check


# The executor's computations by the content of their programs and how they run (see
# LoadedExecutable._compile), while an executable holds them. jax compiles a program again
# where only what the simulator does not see differs (mesh.isa.content): the simulator
# builds nothing for it then (no tracing, lowering or XLA compile of its own).
_COMPILED_RUNS: "weakref.WeakValueDictionary[tuple, _CompiledRun]" = \
    weakref.WeakValueDictionary()


class LoadedExecutable:
    """A Trn2 program compiled into one XLA computation over the whole simulated mesh.

    `execute` takes and returns global arrays (shard_map bodies split and assemble them by
    the module's shardings); `execute_sharded` takes and returns one buffer list per device,
    as PJRT does.

    A module with mhlo.num_replicas x mhlo.num_partitions processes and no sdy.mesh is SPMD
    code that each process runs on its own arguments, on the mesh ('replica', 'partition')
    (lowering.replica_groups.ProcessGrid): `execute_sharded` gives each device its own
    buffers and returns each device's results; `execute` gives every device the same
    arguments and returns device 0's results. Process d runs on chip d (PJRT's default device
    assignment), so a module of fewer processes than chips leaves the other chips idle.
    """

    def __init__(self, program: isa.Program, topology: Topology,
                 arg_names: Sequence[str] | None = None,
                 rounding: numerics.Rounding = numerics.NEAREST,
                 executor_devices: Sequence[jax.Device] | None = None,
                 device_assignment: Sequence[int] | None = None,
                 module: Any = None):
        """`module`: the StableHLO module the program was lowered from (for `layouts`)."""
        self.topology = topology
        self.module = module
        self.rounding = rounding
        self.executor_devices = tuple(executor_devices) if executor_devices else None
        self._workspace: list[jax.Array] | None = None  # kept for the next execute
        self._workspace_made: concurrent.futures.Future | None = None  # the first one
        self._workspace_lock = threading.Lock()
        self.placement = _placement(topology, program.mesh, device_assignment)
        # What runs is the planned program: matmuls tiled, collectives mapped on the torus.
        self.program = plan_program(program, topology, self.placement)
        self.arg_names = tuple(arg_names) if arg_names is not None else \
            tuple(f"argument {i}" for i in range(len(program.inputs)))
        self._chip_outputs: tuple[int, ...] = ()  # see return_chip_pieces
        self._result_shardings: tuple[NamedSharding, ...] | None = None  # see place_results

    @cached_property
    def _run(self) -> _CompiledRun:
        """The program as one XLA computation over arrays in the executor layout (for
        `execute_sharded`), compiled on first use (listing and estimates do not need it)."""
        return self._compile(global_io=False)

    @cached_property
    def _run_global(self) -> _CompiledRun:
        """The program as one XLA computation of global arrays (for `execute`)."""
        return self._compile(global_io=True)

    @cached_property
    def _global_program(self) -> isa.Program:
        """The program `execute` runs (compile_program makes it so): the planned one,
        giving the outputs return_chip_pieces names as their chips' pieces."""
        return with_chip_outputs(self.program, self._chip_outputs)

    def _compile(self, global_io: bool) -> _CompiledRun:
        """The program's computation for the executor: that of a program of the same
        content compiled before, while some executable still holds it, else a new one."""
        values = self.program.values
        inputs = [jax.ShapeDtypeStruct(shape, input_dtype(values[v].type.dtype, self._on_cpu))
                  for shape, v in zip(input_shapes(self.program, global_io),
                                      self.program.inputs)]
        workspace = self._workspace_values if global_io else ()
        devices = self._devices
        spread = global_io and devices is not None and len(devices) > 1
        chip_outputs = self._chip_outputs if global_io else ()
        result_shardings = tuple(self.result_shardings) if spread else None
        # A program without inputs or outputs has no sharding to place its computation
        # by: jax would compile it for its default device, which may be the trn2 plugin
        # (JAX_PLATFORMS=trn2), which refuses the executor's XLA options.
        on_device = jax.default_device(devices[0]) if devices is not None and \
            len(devices) == 1 else contextlib.nullcontext()
        with _executor_context(), on_device:
            # jax's configuration as it traces (config.trace_context), as jax keys its own
            # caches by: the executor's computation is traced under it
            key = (program_key(self.program), self.rounding, devices, global_io,
                   tuple(workspace), chip_outputs, result_shardings, config.trace_context())
            compiled = _COMPILED_RUNS.get(key)
            if compiled is None:
                split_check = SplitGroupCheck()
                with _lowered_in_shared_context(self.program):
                    lowered = compile_program(
                        self.program, self.rounding, devices, global_io, split_check,
                        workspace, chip_outputs, result_shardings).lower(
                            *inputs, *self._workspace_types(workspace))
                # (XLA's LLVM level, where it cannot change the results: a faster compile)
                options = optimization_level.compiler_options(lowered.compiler_ir("stablehlo"))
                compiled = _CompiledRun(lowered.compile(options), split_check)
                _COMPILED_RUNS[key] = compiled
            return compiled

    @cached_property
    def _devices(self) -> tuple[jax.Device, ...] | None:
        """The JAX devices the simulation runs on: `executor_devices`, else, when jax's
        default backend is a GPU or TPU, its default device (None), else the one device of
        a CPU client of the simulator's own (lowering.host): never the trn2 plugin's, which
        runs this executable itself when it is jax's default backend.

        The executor is one computation. XLA:CPU runs a kernel slower on a client of many
        devices, as users of sharded JAX on a CPU configure it (jax_num_cpu_devices=64):
        measured, a BF16 GEMM of 1024x128x4096 took 1.3 ms there and 0.86 ms on a client of
        one device. Results come back to jax's default device as views, not copies."""
        if self.executor_devices is not None:
            return self.executor_devices
        if jax.default_backend() in _ACCELERATORS:
            return None
        return (host_devices(1)[0],)

    def _to_callers_device(self, results: list[Any]) -> list[Any]:
        """Results of the simulator's own CPU client on jax's default CPU device (their
        buffers, not copies), as results computed there would be. (A result donated to
        jax.jit later is then copied there, not updated in place: XLA does not take over a
        buffer it shares.)"""
        if self.executor_devices is not None or self._devices is None or \
                jax.default_backend() != "cpu":
            return results  # computed where the caller asked, or on jax's default device
        own = [i for i, r in enumerate(results) if isinstance(r, jax.Array)]
        with jax.enable_x64(True):  # a 64-bit result keeps its type, as the run gave it
            moved = jax.device_put([np.asarray(results[i]) for i in own])
        placed = list(results)
        for i, result in zip(own, moved):
            placed[i] = result
        return placed

    @cached_property
    def spans_processes(self) -> bool:
        """Whether the simulation runs on the devices of several processes (jax.distributed,
        a multi-controller job): every process then runs `execute` on the same arguments
        (host arrays, alike in every process, or global jax arrays) and gets global jax
        arrays, of which it holds its own devices' shards (result_shardings)."""
        return any(d.process_index != jax.process_index() for d in self.executor_devices or ())

    @property
    def result_shardings(self) -> list[NamedSharding]:
        """Where `execute` leaves each result over several executor devices: those
        place_results gave, else its global array split over them
        (mesh.executor.split_over)."""
        if self._result_shardings is not None:
            return list(self._result_shardings)
        return [split_over(self._devices, shape) for shape in self.result_shapes]

    @property
    def result_shapes(self) -> list[tuple[int, ...]]:
        """The shape of each of `run`'s results: the output's own, or for those
        return_chip_pieces names, their chips' pieces' executor layout."""
        return output_shapes(self.program, True, self._chip_outputs)

    def place_results(self, shardings: Sequence[NamedSharding]) -> None:
        """Have `execute` over several executor devices leave its results (result_shapes)
        on `shardings`, one per result (mesh.executor.split_covering: for a caller that
        reads each process's part from its own shards). Before it compiles for `execute`."""
        shardings = tuple(shardings)
        if len(shardings) != len(self.program.outputs):
            raise ValueError(f"place_results: {len(shardings)} shardings for "
                             f"{len(self.program.outputs)} results")
        if "_run_global" in self.__dict__ and shardings != self._result_shardings:
            raise ValueError("place_results: the results' shardings were fixed when it "
                             "compiled")
        self._result_shardings = shardings

    @cached_property
    def _on_cpu(self) -> bool:
        """Whether the simulation runs on CPU devices (mesh.executor.runs_on_cpu)."""
        return runs_on_cpu(self._devices)

    @cached_property
    def _workspace_values(self) -> tuple[int, ...]:
        """The values `execute` keeps buffers for from call to call (on one executor
        device; mesh.executor.workspace_values)."""
        if self.executor_devices is not None and len(self.executor_devices) > 1:
            return ()
        return workspace_values(self._global_program, self._on_cpu, self.rounding)

    def _workspace_types(self, workspace: Sequence[int]) -> list[jax.ShapeDtypeStruct]:
        values = self.program.values
        return [jax.ShapeDtypeStruct(self.program.array_shape(v),
                                     dtypes.storage_dtype(values[v].type.dtype))
                for v in workspace]

    def _take_workspace(self) -> list[jax.Array]:
        """The buffers the last execute left for this one to write into, or new ones (on
        the first call, or while another thread's call has them)."""
        with self._workspace_lock:
            kept, self._workspace = self._workspace, None
            made, self._workspace_made = self._workspace_made, None
        if kept is not None or not self._workspace_values:
            return kept or []
        return made.result() if made is not None else self._make_workspace()

    def prefetch_workspace(self) -> None:
        """Start making the first call's workspace on a thread of its own, for a call about
        to run: its compile and page faults then overlap the executor's compile
        (jax_trn2.jit's first call) or the assembly of the arguments (the plugin's). A
        program that is compiled and never run makes none."""
        if not self._workspace_values:
            return
        # the maker is made here, not on the worker: it picks the executor's devices, and
        # neither cached_property nor host_devices is thread-safe
        _ = self._new_workspace
        with self._workspace_lock:
            if self._workspace is None and self._workspace_made is None:
                self._workspace_made = _BACKGROUND.submit(self._make_workspace)

    def _make_workspace(self) -> list[jax.Array]:
        """New workspace buffers (from any thread: in the executor's context)."""
        with _executor_context():
            return jax.block_until_ready(self._new_workspace())

    @cached_property
    def _new_workspace(self) -> Any:
        """Zeroed workspace buffers, made on the executor's device."""
        types = self._workspace_types(self._workspace_values)
        return _zeros_maker(tuple(types), self._devices[0] if self._devices else None)

    def _keep_workspace(self, results: list[jax.Array]) -> list[jax.Array]:
        """The program's outputs; the workspace arrays after them are kept."""
        n_outputs = len(self.program.outputs)
        if len(results) > n_outputs:
            with self._workspace_lock:
                self._workspace = list(results[n_outputs:])
        return results[:n_outputs]

    @staticmethod
    @contextlib.contextmanager
    def _checked_run(run: _CompiledRun):
        """Around a run of `run`: SplitCollectiveError after it if it met a collective that
        only some members of a group reached (possible only where control flow differs by
        chip). Runs of such a program are serialised, so that each reports its own."""
        split_check = run.split_check
        if not split_check.armed:  # known once compiled: before the first run
            yield
            return
        with split_check.lock:
            yield
            jax.effects_barrier()  # the checks' host callbacks have all run
            split_check.raise_if_split()

    def return_chip_pieces(self, positions: Sequence[int]) -> None:
        """Have `execute` return the outputs at `positions`, each assembled by an Unshard
        (mesh.executor.output_unshard), as their chips' pieces in the executor layout
        (mesh.executor.with_chip_outputs): for a caller that hands each device its piece.
        Before the executable is compiled for `execute` (load, or a first execute)."""
        positions = tuple(sorted(set(positions)))
        if positions != self._chip_outputs:
            if "_global_program" in self.__dict__:
                raise ValueError("return_chip_pieces: the outputs returned as chip pieces "
                                 f"were fixed at {self._chip_outputs} when it compiled")
            self._chip_outputs = positions

    def load(self, check_memory: bool = True) -> "LoadedExecutable":
        """Compile the program for the host now (otherwise the first execute does): for
        `execute_sharded` when it takes each device's own arguments (an SPMD module), for
        `execute` otherwise. First, unless `check_memory` is False, OutOfHBMError when the
        program does not fit some chip's HBM (as XLA's compile fails with
        RESOURCE_EXHAUSTED). What every front door's compile is: jax_trn2.jit's, the
        client's and the plugin's."""
        if check_memory:
            self.check_memory()
        per_device = any(self.program.values[v].varying for v in self.program.inputs)
        _ = self._run if per_device else self._run_global
        return self

    @classmethod
    def from_stablehlo(cls, topology: Topology | str | None, stablehlo: Any,
                       arg_names: Sequence[str] | None = None,
                       rounding: numerics.Rounding = numerics.NEAREST,
                       executor_devices: Sequence[jax.Device] | None = None,
                       device_assignment: Sequence[int] | None = None,
                       host_callbacks: Sequence[Any] | None = None,
                       module_name: str = lowering.MODULE_TEXT) -> "LoadedExecutable":
        """Lower and compile StableHLO for `topology` (None: the one the mesh was made for),
        rounding to narrow floats as `rounding` says; the simulation runs on the JAX
        devices `executor_devices` (default: see LoadedExecutable._devices;
        mesh.executor.compile_program). `device_assignment[d]` is the chip logical device
        d runs on (default: a jax mesh placed on the torus, an SPMD module's processes on
        the first chips). `host_callbacks`: the Python functions of the module's host
        callbacks, as jax's lowering keeps them. `module_name`: the file the module text
        came from, where an op without a debug location is (lowering.lower)."""
        module = lowering.parse_module(stablehlo)
        # the lowering's own jax computations (constant folding), as the executor's
        with watchers.unwatched() if watchers.installed() else contextlib.nullcontext():
            program = lowering.lower(module, host_callbacks=host_callbacks,
                                     module_name=module_name)
        if not isinstance(topology, Topology):
            topology = topology_for(program.mesh.axis_sizes, program.mesh.axis_names, topology)
        if program.mesh.axis_names == PROCESS_GRID_AXES and \
                program.mesh.num_devices > topology.num_devices:
            replicas, partitions = program.mesh.axis_sizes
            raise ValueError(
                f"the module has {replicas} replicas x {partitions} partitions = "
                f"{program.mesh.num_devices} processes, but topology '{topology.name}' has "
                f"only {topology.num_devices} devices (one process runs on each device; trn2: "
                "16, trn2-ultra: 64, trn2-ultra-max: 256, trn2.48xlarge: 64 logical cores)")
        return cls(program, topology, arg_names, rounding, executor_devices, device_assignment,
                   module)

    @cached_property
    def layouts(self) -> tuple[tuple, tuple]:
        """How XLA lays the module's arguments and results out over the mesh, as dim_axes per
        leaf (None: replicated; lowering.partition.layouts): the pieces each device holds."""
        return partition.layouts(self.module, self.program)

    def devices(self) -> list[Device]:
        """The machine devices (chips, or logical cores) the program runs on, in logical
        device order (row-major over the mesh)."""
        devices = self.placement.device_ids if self.placement else (0,)
        return [Device(d, self.topology.device_coords(d)) for d in devices]

    def as_text(self) -> str:
        """The Trn2 program listing, headed by the machine it was planned for."""
        return target_text(self.topology, self.placement) + "\n" + \
            printer.program_text(self.program)

    @cached_property
    def estimate(self) -> ProgramEstimate:
        """Estimated per-chip costs and timeline of the program (mesh.perf.estimate)."""
        return ProgramEstimate(self.program, self.topology, self.placement, self.arg_names)

    def memory_analysis(self, chip: int | None = None) -> MemoryStats:
        """HBM use of chip `chip` over one step (jax's CompiledMemoryStats field names), or
        of the chip with the highest peak when None (mesh.memory)."""
        return self.estimate.memory.stats(chip)

    def check_memory(self) -> None:
        """Raise OutOfHBMError when the program's peak exceeds some chip's HBM. A program
        whose values all fit at once (mesh.memory.bytes_bound) fits without its schedule
        and liveness being worked out (most compiles: they cost more than its XLA
        compile)."""
        if bytes_bound(self.program) > self.topology.device.hbm_bytes:
            self.estimate.memory.check()

    def timed_text(self) -> str:
        """The listing with an estimated start and duration on every instruction, and the
        step-time summary."""
        return self.estimate.listing()

    def cost_analysis(self) -> dict:
        """Per-chip 'flops', 'bytes accessed', 'transcendentals', 'optimal_seconds' (the
        estimated step time), as jax's cost_analysis, plus a 'trn2' breakdown."""
        return self.estimate.cost_analysis()

    def save_trace(self, path: str | os.PathLike, chips: Iterable[int] | None = None) -> None:
        """Write the estimated timeline as Chrome trace-event JSON (Perfetto,
        chrome://tracing): one process per chip (all, or the chip ids `chips`)."""
        trace.write_trace(path, trace.chrome_trace(self.estimate, chips))

    def execute(self, args: Sequence[Any], chip_pieces: bool = False) -> list[Any]:
        """Run on global arrays; returns the global results (of an SPMD module: every
        device gets `args`, and the results are device 0's). With `chip_pieces`, the
        outputs return_chip_pieces names come as their chips' pieces, in the executor
        layout, where they are (jax_trn2.jit hands each device its piece); without, they
        are assembled here."""
        results = self.run(args)
        chips = set(self._chip_outputs)
        if not chip_pieces:
            results = [self._assembled(i, r) if i in chips else r
                       for i, r in enumerate(results)]
            chips = set()
        moved = iter(self._to_callers_device([r for i, r in enumerate(results)
                                              if i not in chips]))
        return [r if i in chips else next(moved) for i, r in enumerate(results)]

    def _assembled(self, i: int, chips: Any) -> np.ndarray:
        """Output i, which the run gave as its chips' pieces, as the global array."""
        unshard = output_unshard(self.program, i)
        return sharding.unshard(chips, unshard.dim_axes, self.program.mesh.axis_sizes)

    def run(self, args: Sequence[Any]) -> list[Any]:
        """`execute`, its results left where the simulation computed them, the outputs
        return_chip_pieces names as their chips' pieces (the trn2 plugin reads them
        there)."""
        arrays = self._check_args(args)
        run = self._run_global  # compiled first: a program's checks are known after
        with self._host_memory_named(), self._lost_processes_named():
            with _executor_context(), self._checked_run(run):
                # finished here: a failure of the run (XLA:CPU out of memory) is raised
                # inside _host_memory_named, and never leaves a failed workspace kept
                outs = run.compiled(*self._as_inputs(arrays), *self._take_workspace())
                if self.spans_processes:  # a collective waiting on a stopped process
                    lost = wait_for_run(outs, self._owners)
                    if lost:
                        raise self._lost_error(lost, "its collectives waited on it")
                outs = self._keep_workspace(jax.block_until_ready(outs))
            program = self._global_program
            return [sharding.PerChip(o, program.array_shape(v)) if isinstance(o, list) else
                    storage_to_host(o, program.values[v].type.dtype)
                    for o, v in zip(outs, program.outputs)]

    @contextlib.contextmanager
    def _host_memory_named(self):
        """XLA:CPU's RESOURCE_EXHAUSTED while the simulation runs, as HostMemoryError."""
        try:
            yield
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            chips = self.program.mesh.num_devices
            peak = self.memory_analysis().peak_memory_in_bytes
            raise HostMemoryError(
                f"the host ran out of memory running the simulation of {chips} "
                f"chip{'s' if chips != 1 else ''} "
                f"({str(e).splitlines()[0]}). The chips fit: each needs at most {peak:,} bytes "
                "of HBM (memory_analysis()). The simulator holds every chip's values of an op "
                "at once in host memory, and some values whole that a chip would compute a "
                "tile at a time (a broadcast product before its reduction): run it at smaller "
                "shapes, or over several devices (jax_trn2.jit's executor_devices).") from None

    @contextlib.contextmanager
    def _lost_processes_named(self):
        """A run over the devices of several processes that fails because some of them
        stopped, as ProcessLostError naming them (jax_trn2.core.processes)."""
        try:
            yield
        except (jax.errors.JaxRuntimeError, ValueError) as e:
            if not self.spans_processes or not runtime_failure(e):
                raise
            lost = lost_processes(self._owners)
            if not lost:
                raise
            raise self._lost_error(lost, str(e).splitlines()[0]) from e

    @property
    def _owners(self) -> list[int]:
        """The processes whose devices the simulation runs on."""
        return sorted({d.process_index for d in self._devices})

    def _lost_error(self, lost: list[int], cause: str) -> ProcessLostError:
        return ProcessLostError(
            f"process{'es' if len(lost) > 1 else ''} {lost} of the jax.distributed job "
            f"stopped while the simulation ran over the devices of processes {self._owners} "
            f"({cause}). Every process of a run must take part in it: restart the job (from "
            "a checkpoint)")

    def from_every_process(self, local: np.ndarray) -> np.ndarray:
        """For a run over the devices of several processes (spans_processes): every
        process's `local` (the same shape and dtype in each), stacked in process order, in
        every process, moved by jax's collectives over the executor devices (what each
        process holds that the others need for the run: the trn2 plugin's argument
        pieces). Every process calls it alike; ProcessLostError names one that stopped."""
        with self._lost_processes_named(), _executor_context():
            return stacked_over_processes(local, self._devices)

    def execute_sharded(self, per_device_args: Sequence[Sequence[Any]]) -> list[list[Buffer]]:
        """Run on one argument list per device (logical device order); returns one result
        list per device. A shard_map program's arguments are assembled from the pieces by
        their shardings (pieces of an argument it replicates must be equal); an SPMD
        module's arguments are each device's own."""
        devices = self.devices()
        if len(per_device_args) != len(devices):
            raise TypeError(f"execute_sharded: expected argument lists for {len(devices)} "
                            f"devices, got {len(per_device_args)}")
        for d, dev_args in enumerate(per_device_args):
            if len(dev_args) != len(self.program.inputs):
                raise TypeError(f"execute_sharded: device {d} has {len(dev_args)} arguments, "
                                f"expected {len(self.program.inputs)}")
            for i, arg in enumerate(dev_args):
                if isinstance(arg, Buffer) and arg.device != devices[d]:
                    raise ValueError(
                        f"execute_sharded: {self.arg_names[i]} at position {d} is a buffer "
                        f"on {arg.device}, but position {d} runs on {devices[d]}: put it there "
                        f"with buffer_from_pyval(array, executable.devices()[{d}])")
        with _executor_context():
            inputs = [self._device_input(i, [dev_args[i] for dev_args in per_device_args])
                      for i in range(len(self.program.inputs))]
            run = self._run  # compiled first: a program's checks are known after
            with self._checked_run(run):
                outs = run.compiled(*inputs)
            per_output = [self._device_results(i, o) for i, o in enumerate(outs)]
        return [[Buffer(pieces[d], device) for pieces in per_output]
                for d, device in enumerate(devices)]

    def _device_input(self, i: int, pieces: list[Any]) -> jnp.ndarray:
        """Input i in the executor's layout from one piece per device."""
        value = self.program.inputs[i]
        expected = self.program.values[value].type
        if self.program.values[value].varying:  # an SPMD module's per-device argument
            arrays = [self._check_arg(f"{self.arg_names[i]} of device {d}", p, expected)
                      for d, p in enumerate(pieces)]
            return as_input(jnp.stack([host_to_storage(a) for a in arrays]).reshape(
                self.program.array_shape(value)), expected.dtype, on_cpu=self._on_cpu)
        dim_axes = self._sharding(self.program.input_shardings, i, expected.rank)
        piece_type = isa.TensorType(sharding.local_shape(expected.shape, dim_axes,
                                                         self.program.mesh.axis_sizes),
                                    expected.dtype)
        try:
            pieces = [np.asarray(self._check_arg(f"{self.arg_names[i]} of device {d}", p,
                                                 piece_type)) for d, p in enumerate(pieces)]
        except TypeError as e:
            if any(dim_axes):
                raise
            raise TypeError(f"{e} (main's argument {i} has no sharding in the module, so "
                            "every device takes the whole array; for per-device pieces, "
                            "lower with jax.jit(..., in_shardings=...))") from None
        global_ = self._assemble(i, pieces)
        array = self._check_arg(self.arg_names[i], global_, expected)
        return as_input(host_to_storage(array).reshape(self.program.array_shape(value)),
                        expected.dtype, on_cpu=self._on_cpu)

    def _device_results(self, i: int, result: jnp.ndarray) -> list[np.ndarray]:
        """Each device's piece of output i: split by its sharding, else the device's own."""
        mesh = self.program.mesh
        dim_axes = self.program.output_shardings[i] \
            if i < len(self.program.output_shardings) else None
        result = storage_to_host(result, self.program.values[self.program.outputs[i]].type.dtype)
        if dim_axes is not None:
            return sharding.split(np.asarray(result[(0,) * mesh.rank]), dim_axes,
                                  mesh.axis_sizes)
        local = result.shape[mesh.rank:]
        per_device = np.broadcast_to(np.asarray(result), tuple(mesh.axis_sizes) + local)
        return list(per_device.reshape((-1,) + local))

    def _assemble(self, i: int, pieces: list[np.ndarray]) -> np.ndarray:
        dim_axes = self._sharding(self.program.input_shardings, i, pieces[0].ndim)
        try:
            return sharding.assemble(pieces, dim_axes, self.program.mesh.axis_sizes)
        except ValueError as e:
            raise ValueError(f"{self.arg_names[i]}: {e}") from None

    @staticmethod
    def _sharding(shardings: tuple, i: int, rank: int):
        given = shardings[i] if i < len(shardings) else None
        return given if given is not None else ((),) * rank

    def _as_inputs(self, arrays: Sequence[Any]) -> list[Any]:
        """Checked arguments as the compiled program takes them (mesh.executor.as_input)."""
        device = self._devices[0] if self._devices and len(self._devices) == 1 else None
        inputs = [as_input(host_to_storage(a), self.program.values[v].type.dtype, device,
                           self._on_cpu)
                  for a, v in zip(arrays, self.program.inputs)]
        if not self.spans_processes:
            return inputs
        return [_global_input(x, target) for x, target in zip(inputs, self.argument_shardings)]

    @cached_property
    def argument_shardings(self) -> list[NamedSharding]:
        """Where `execute`'s computation takes each argument over several executor devices:
        each device the part its chips read (mesh.executor.read_sharding). A global array
        laid out so goes in as it is; of a host array, each process gives its devices'
        parts."""
        return [read_sharding(self.program, i, self._devices)
                for i in range(len(self.program.inputs))]

    def _check_args(self, args: Sequence[Any]) -> list[jnp.ndarray]:
        """Arguments as arrays of exactly the program's input types; TypeError naming the
        argument, what was expected and what was given otherwise."""
        expected = self._input_types
        if len(args) != len(expected):
            raise TypeError(f"expected {len(expected)} arguments "
                            f"({', '.join(self.arg_names)}), got {len(args)}")
        return [self._check_arg(name, arg, t)
                for name, arg, t in zip(self.arg_names, args, expected)]

    @cached_property
    def _input_types(self) -> list[isa.TensorType]:
        return [self.program.values[v].type for v in self.program.inputs]

    @staticmethod
    def _check_arg(name: str, arg: Any, expected: isa.TensorType) -> Any:
        if isinstance(arg, Buffer):
            arg = arg.to_jax()
        if isinstance(arg, jax.Array) and len(arg.sharding.device_set) > 1 and \
                arg.is_fully_addressable:
            arg = np.asarray(arg)  # sharded over host devices: gather it for the simulated mesh
        # (one over the devices of several processes goes in as it is, each process
        # giving its shards: spans_processes)
        if isinstance(arg, (bool, int, float, complex)):  # take the parameter's type
            arg = python_scalar(name, arg, expected)
        shape, dtype = tuple(np.shape(arg)), getattr(arg, "dtype", None)
        if dtype is None or dtypes.numpy_name(dtype) != expected.dtype or \
                shape != expected.shape:
            got = f"{np.dtype(dtype).name if dtype is not None else type(arg).__name__}" \
                  f"[{','.join(map(str, shape))}]"
            raise TypeError(f"{name}: expected {expected}, got {got}")
        return arg
