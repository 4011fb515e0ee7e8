"""The vectorized executor: a whole Trn2 program as one jax.jit-compiled function.

Every value is one array whose leading dims are the logical mesh axes, of full size where the
value varies from chip to chip and of size 1 where it is replicated (mesh.isa). Tracing the
program once gives one XLA computation for all chips, so simulating the mesh costs about what
the distinct work costs.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax._src.lib import _jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from mesh import dtypes, isa, numerics
from mesh.sharding import PerChip, Region, contains
from mesh.isa.kernels import kernel_for
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.matmul import converts_native_matmul, result_is_gemm_output
from mesh.isa.kernels.movement import unshard_places_matmul
from mesh.isa.kernels.participation import SplitGroupCheck, meeting_groups


class ExecutionError(RuntimeError):
    """An instruction failed while the program was traced; names the instruction."""


def run_program(program: isa.Program, args: Sequence[jnp.ndarray],
                rounding: Callable | None = None,
                active: jnp.ndarray | None = None,
                split_check: SplitGroupCheck | None = None,
                executor: Mesh | None = None, on_cpu: bool = True,
                per_chip: frozenset[int] = frozenset()) -> list[jnp.ndarray | PerChip]:
    """Run `program` on arrays in the executor layout (traceable: use under jax.jit);
    `active`: the chips whose control flow reaches it (KernelContext.active);
    `split_check`: checks, where `active` is not every chip, that each collective's groups
    are reached whole (mesh.isa.kernels.participation); `executor`: the devices the
    computation is split over (KernelContext.executor); `on_cpu`: whether they are CPUs
    (KernelContext.on_cpu); `per_chip`: outputs that may come as PerChip
    (KernelContext.per_chip)."""
    env: dict[int, jnp.ndarray | PerChip] = dict(zip(program.inputs, args))
    ctx = KernelContext(program, run=lambda p, a, reached=active: run_program(
        p, a, rounding, reached, split_check, executor, on_cpu), rounding=rounding,
        active=active, executor=executor, on_cpu=on_cpu, uses=value_uses(program),
        per_chip=per_chip)
    for instr in program.instructions:
        groups = meeting_groups(instr) \
            if active is not None and split_check is not None else None
        if groups is not None:
            split_check.check(instr, groups, active, program.mesh)
        operands = [env[i] for i in instr.ins]
        try:
            results = kernel_for(instr)(instr, operands, ctx)
        except Exception as e:  # wrap once, at the innermost level, with the instruction
            if isinstance(e, ExecutionError):
                raise
            raise ExecutionError(f"{instr.mnemonic} at {instr.loc or 'unknown location'} "
                                 f"failed: {type(e).__name__}: {e}") from e
        for value, result in zip(instr.outs, results):
            env[value] = _to_layout(result, program, value, instr)
            ctx.made_by[value] = (instr, operands)
    return [env[v] for v in program.outputs]


def _to_layout(x: jnp.ndarray | PerChip, program: isa.Program, value: int,
               instr) -> jnp.ndarray | PerChip:
    """Broadcast a kernel's result to its value's declared layout; a result that varies
    where the layout says replicated is a lowering bug, reported as such."""
    info = program.values[value]
    expected = program.array_shape(value)
    if isinstance(x, PerChip) and x.shape != expected:
        raise ExecutionError(f"{instr.mnemonic} at {instr.loc}: per-chip result of shape "
                             f"{x.shape}, expected its layout {expected}")
    if x.shape != expected:
        try:
            x = jnp.broadcast_to(x, expected)
        except ValueError:
            raise ExecutionError(f"{instr.mnemonic} at {instr.loc}: result shape {x.shape} "
                                 f"does not fit its layout {expected}") from None
    want = dtypes.storage_name(info.type.dtype)
    if x.dtype.name != want:
        raise ExecutionError(f"{instr.mnemonic} at {instr.loc}: result type {x.dtype.name}, "
                             f"expected {want}")
    return x


# XLA's options for the executor's computations, which must give the same bits however
# their chips are split over devices and processes:
# - xla_allow_excess_precision: XLA may otherwise drop a rounding to a narrow float between
#   two ops; the engines round every result to its type, so every rounding must stay.
# - xla_cpu_experimental_ynn_fusion_type empty: XLA:CPU hands some fusions (reductions and
#   the elementwise ops fused into them, dots) to YNNPACK, whose exp and sums are not
#   XLA's own; whether it does depends on the shapes a device computes (measured: a
#   softmax's exp differed by an ulp between 4 and 8 executor devices).
EXECUTOR_COMPILER_OPTIONS = {"xla_allow_excess_precision": False,
                             "xla_cpu_experimental_ynn_fusion_type": ""}


# Matmul results of at least this many bytes (the largest block glibc's malloc recycles)
# are workspace values (workspace_values), up to this many bytes per program: the host
# memory each executable keeps between calls (while it lives, as in jax_trn2.jit's cache).
WORKSPACE_MIN_BYTES = 32 << 20
WORKSPACE_LIMIT_BYTES = 1 << 30
# Outputs returned as chips' pieces (compile_program's `chip_outputs`) of at least this
# many bytes may be made one array per chip (KernelContext.per_chip): one array of this
# size glibc maps fresh on every call, and the kernel's first writes fault it in (a
# 48 MiB result of the native matmul ran 4-7% faster as 64 arrays, on a 2-core AMD EPYC)
PER_CHIP_MIN_BYTES = WORKSPACE_MIN_BYTES


def runs_on_cpu(devices: Sequence[jax.Device] | None) -> bool:
    """Whether a computation for `devices` (compile_program's) runs on CPUs."""
    return all(d.platform == "cpu" for d in devices) if devices \
        else jax.default_backend() == "cpu"


def value_uses(program: isa.Program) -> collections.Counter:
    """How many times the program uses each value: as an argument of an instruction (a
    sub-program's captured values are its instruction's arguments) or as an output."""
    return collections.Counter([v for instr in program.instructions for v in instr.ins]
                               + list(program.outputs))


def workspace_values(program: isa.Program, on_cpu: bool = True,
                     rounding: numerics.Rounding = numerics.NEAREST) -> tuple[int, ...]:
    """The values whose arrays an executable keeps from one call to the next and gives
    back to XLA for the next call to write into (compile_program's `workspace`).

    These are the results of top-level matmuls written as the host GEMM lays them out, of
    at least WORKSPACE_MIN_BYTES: every chip's product in one array, the executor's
    largest (a data-parallel step's weight gradients before their reduce-scatter).
    Otherwise XLA:CPU places them in each call's block of temporaries, which glibc maps
    fresh from the kernel every call, paying a page fault per 4 KiB. An FSDP step with
    256 MiB of gradients runs about twice as fast with them kept. A matmul whose Unshard
    it writes into (unshard_places_matmul, with round-to-nearest-even `rounding`) has no
    array of its own to keep, and one the program returns (with_chip_outputs) is the
    caller's; nor has one the matmul writes rounded as its conversion
    (converts_native_matmul)."""
    chosen, total = [], 0
    placed = _made_by_their_user(program, on_cpu, rounding.mode == "nearest")
    for instr in program.instructions:
        if not isinstance(instr, isa.Matmul) or instr.outs[0] in placed or \
                instr.outs[0] in program.outputs or \
                not result_is_gemm_output(instr, program, on_cpu):
            continue
        value = instr.outs[0]
        size = _array_bytes(program, value)
        if size >= WORKSPACE_MIN_BYTES and total + size <= WORKSPACE_LIMIT_BYTES:
            chosen.append(value)
            total += size
    return tuple(chosen)


def _made_by_their_user(program: isa.Program, on_cpu: bool, nearest: bool) -> set[int]:
    """The matmul products that have no array of their own: their only user's result is
    made by the matmul instead, written into an Unshard's result
    (movement.unshard_places_matmul) or rounded as a conversion
    (matmul.converts_native_matmul)."""
    uses, made_by = value_uses(program), {}
    placed = set()
    for instr in program.instructions:
        made_by.update((v, instr) for v in instr.outs)
        if not instr.ins or instr.ins[0] not in made_by:
            continue
        maker = made_by[instr.ins[0]]
        places = isinstance(instr, isa.Unshard) and unshard_places_matmul(
            instr, maker, program, uses, on_cpu, nearest)
        if places or converts_native_matmul(instr, maker, program, uses, on_cpu, nearest):
            placed.add(instr.ins[0])
    return placed


def output_unshard(program: isa.Program, position: int) -> isa.Unshard | None:
    """The Unshard that assembles output `position` of `program` from its chips' pieces,
    if a top-level one makes it (a sharded result of a shard_map or partitioned module)."""
    value = program.outputs[position]
    return next((instr for instr in program.instructions
                 if isinstance(instr, isa.Unshard) and instr.outs[0] == value), None)


def with_chip_outputs(program: isa.Program, positions: Sequence[int]) -> isa.Program:
    """`program` returning, at output `positions` (each made by output_unshard), the chips'
    pieces its Unshard would assemble, in the executor layout: a caller that hands each
    device its piece has no global array made only to be cut up again. Unshards whose
    results nothing else uses are dropped."""
    if not positions:
        return program
    outputs = list(program.outputs)
    for position in positions:
        unshard = output_unshard(program, position)
        if unshard is None:
            raise ValueError(f"output {position} is not assembled by an Unshard")
        outputs[position] = unshard.ins[0]
    kept = dataclasses.replace(program, outputs=tuple(outputs))
    uses = value_uses(kept)
    instructions = tuple(instr for instr in program.instructions
                         if not isinstance(instr, isa.Unshard) or uses[instr.outs[0]])
    return dataclasses.replace(kept, instructions=instructions)


def _per_chip_outputs(program: isa.Program, positions: Sequence[int]) -> list[int]:
    """The values at output `positions` of `program` that a kernel may make one array per
    chip: of PER_CHIP_MIN_BYTES or more, and not used but as that one output."""
    uses = value_uses(program)
    values = [program.outputs[i] for i in positions]
    return [v for v in values if uses[v] == 1 and _array_bytes(program, v) >= PER_CHIP_MIN_BYTES]


def _array_bytes(program: isa.Program, value: int) -> int:
    """The bytes of the value's array in the executor (every chip's piece, in its storage
    type)."""
    return int(np.prod(program.array_shape(value), dtype=np.int64)) * \
        dtypes.storage_dtype(program.values[value].type.dtype).itemsize


def compile_program(program: isa.Program,
                    rounding: numerics.Rounding = numerics.NEAREST,
                    devices: Sequence[jax.Device] | None = None,
                    global_io: bool = False,
                    split_check: SplitGroupCheck | None = None,
                    workspace: Sequence[int] = (),
                    chip_outputs: Sequence[int] = (),
                    out_shardings: Sequence[NamedSharding] | None = None) -> Callable:
    """One jax.jit-compiled function of the program's input arrays (executor layout).

    With `global_io`, it takes each input as one array of the value's own shape, the same
    on every chip, and returns each output as chip 0 holds it: what `execute` passes and
    returns. Reshaping into the executor layout inside the computation costs nothing there,
    where eager reshapes and indexing around it would copy every argument on every call.

    `rounding` is the policy for rounding to narrow floats; each trace gets a fresh rounding
    hook, so a stochastic program's rounding sites are numbered the same way every time.

    `devices`: None for jax's default device; one device to run there; several (JAX
    devices of any backend: CPU devices, GPUs, the devices of several hosts under
    jax.distributed) to share the simulation: each input and output is split over them
    (split_over), and XLA's SPMD partitioner spreads the one computation over them, with
    its collectives between devices (across processes, jax's: gloo or MPI on CPUs, NCCL
    on GPUs) where a kernel reads chips another device holds. The arithmetic does not
    change with the devices: every matmul and convolution kernel asks for
    Precision.HIGHEST with FP32 accumulation (on a GPU this rules out TF32 and other
    reduced-precision passes), collectives add element by element in their stated order,
    and `xla_allow_excess_precision` is off, so results are bit-identical to a run on one
    device. (Every float matmul on CPU executor devices, a single pass too, sums in the
    native loop's order, mesh.isa.kernels.native; a host GEMM's order depends on the
    shape each device computes: an FP32 [64,16]x[16,128] GEMM and its [64,16]x[16,32]
    slice differ in the last bit. A float reduction sums in its own fixed order:
    mesh.isa.kernels.reduction.)

    `split_check` (mesh.isa.kernels.participation) records, as the program runs, any
    collective that only some members of a group reach; call its raise_if_split after.

    `workspace` (with `global_io`, one device; workspace_values): values whose arrays the
    function also takes, after the inputs, as donated buffers for XLA to write them into
    (their contents are not read), and returns after the outputs, for the next call.

    `chip_outputs` (with `global_io`): the outputs, each assembled by an Unshard, that it
    returns as their chips' pieces, whole in the executor layout (with_chip_outputs;
    a `workspace` is then one of that program's), or, where one of PER_CHIP_MIN_BYTES or
    more is made so (on one device), as a list of one array per chip (PerChip.arrays).

    `out_shardings` (over several `devices`): where the function leaves each output, in
    place of split_over's (a caller that reads each device's part: split_covering).
    With `global_io` over several devices it takes each input as read_sharding places it.
    """
    out_shapes = output_shapes(program, global_io, chip_outputs)
    program = with_chip_outputs(program, chip_outputs)
    n_outputs = len(program.outputs)
    per_chip = frozenset(_per_chip_outputs(program, chip_outputs)) \
        if global_io and (devices is None or len(devices) == 1) else frozenset()
    executor = None if devices is None or len(devices) == 1 else \
        Mesh(np.array(devices), ("executor",))
    kept = dataclasses.replace(program, outputs=program.outputs + tuple(workspace)) \
        if workspace else program

    def run_placed(values):
        # StableHLO has 64-bit values even when the user's jax has no jax_enable_x64
        # (jax.random's u64 counters, RNG states): they keep their type in the executor.
        with jax.enable_x64(True):
            results = run_program(kept, values, rounding.rounder(), split_check=split_check,
                                  executor=executor, on_cpu=runs_on_cpu(devices),
                                  per_chip=per_chip)
            # computed as whole chips too (where the function leaves a result split along
            # a chip's own dims, XLA's partitioner would split its arithmetic back to it)
            return [_whole_chips(r, devices, program.mesh.rank) for r in results]

    def run(*args):
        with jax.enable_x64(True):
            return run_placed([_whole_chips(_from_input(a, v, program), devices,
                                            program.mesh.rank)
                               for a, v in zip(args, program.inputs, strict=True)])

    def run_global(*args):
        origin = (0,) * program.mesh.rank
        inputs = args[:len(program.inputs)]  # a workspace after them is not read
        with jax.enable_x64(True):
            layout = [_as_read(jnp.broadcast_to(_from_input(a, v, program).reshape(
                (1,) * len(origin) + a.shape), program.array_shape(v)), program, i, devices)
                      for i, (a, v) in enumerate(zip(inputs, program.inputs, strict=True))]
            results = run_placed(layout)
            return [out.arrays if isinstance(out, PerChip) else out if i in chip_outputs
                    else out[origin]
                    for i, out in enumerate(results[:n_outputs])] + results[n_outputs:]

    fun = run_global if global_io else run
    # on one named device: every argument put there, every result left there
    pinned = {} if devices is None or len(devices) != 1 else \
        dict(in_shardings=SingleDeviceSharding(devices[0]),
             out_shardings=SingleDeviceSharding(devices[0]))
    if workspace:
        if not global_io or (devices is not None and len(devices) > 1):
            raise ValueError("a workspace is for a global-io program on one device")
        first = len(program.inputs)
        # keep_unused: jax would drop the workspace arguments (never read) and so their
        # donation
        return jax.jit(fun, compiler_options=EXECUTOR_COMPILER_OPTIONS, keep_unused=True,
                       donate_argnums=tuple(range(first, first + len(workspace))), **pinned)
    if devices is None or len(devices) == 1:
        return jax.jit(fun, compiler_options=EXECUTOR_COMPILER_OPTIONS, **pinned)
    in_shardings = [read_sharding(program, i, devices) for i in range(len(program.inputs))] \
        if global_io else [split_over(devices, shape) for shape in input_shapes(program, False)]
    return jax.jit(fun, compiler_options=EXECUTOR_COMPILER_OPTIONS,
                   in_shardings=tuple(in_shardings),
                   out_shardings=list(out_shardings or  # (a list, as `fun` returns)
                                      (split_over(devices, shape) for shape in out_shapes)))


def _whole_chips(x: jnp.ndarray, devices: Sequence[jax.Device] | None,
                 mesh_rank: int) -> jnp.ndarray:
    """An input in the executor layout, over several `devices` split along a mesh axis
    (its first `mesh_rank` dims) or replicated: each device computes on whole chips.
    Where its arguments are split along a chip's own dims (a global array's, or no mesh
    axis the device count divides), XLA's partitioner would otherwise split the chips'
    arithmetic too, and a sum split so adds in another order (a GEMM's contraction)."""
    if devices is None or len(devices) == 1:
        return x
    return jax.lax.with_sharding_constraint(x, split_over(devices, x.shape, mesh_rank))


def _as_read(x: jnp.ndarray, program: isa.Program, position: int,
             devices: Sequence[jax.Device] | None) -> jnp.ndarray:
    """Input `position` in the executor layout (global_io), over several `devices` as
    their chips read it (read_sharding): an input replicated over the mesh split along the
    dim whose blocks the devices' chips read, else whole on each; one that varies (each
    chip's own) split into whole chips (_whole_chips). Left to XLA, the first would be
    gathered whole to every device."""
    if devices is None or len(devices) == 1 or any(n > 1 for n in x.shape[:program.mesh.rank]):
        return _whole_chips(x, devices, program.mesh.rank)
    dim = _read_dim(program, program.inputs[position], devices)
    return jax.lax.with_sharding_constraint(x, split_along(
        devices, x.ndim, None if dim is None else program.mesh.rank + dim))


def input_dtype(name: str, on_cpu: bool = True) -> np.dtype:
    """The dtype an input of element type `name` goes into compile_program's function in
    (as_input): its storage dtype; but where the executor's devices are not CPUs (`on_cpu`
    false), a float narrower than FP32 as its bits (an unsigned integer of its width).
    There the matmul kernel's XLA loop cuts a narrow-float operand into passes as bits
    (mesh.isa.kernels.matmul), and an input that arrives as bits needs no copy into them;
    on a CPU the native loop reads a BF16 operand as it is, and bits would be bitcast
    into a copy for it (XLA:CPU materializes a bitcast that a custom call reads). On the
    host either is a view of the caller's array."""
    width = dtypes.bit_width(dtypes.storage_name(name))
    if not on_cpu and name in dtypes.LOW_PRECISION_FLOATS and width in (8, 16):
        return np.dtype(f"uint{width}")
    return dtypes.storage_dtype(name)


# Inputs in host memory of at least this many bytes go to the executor's device as the same
# memory (as_input): below it, a copy costs less than the explicit transfer's overhead
# (about 50 us a call).
ZERO_COPY_MIN_BYTES = 1 << 20


def as_input(array, name: str, device: jax.Device | None = None, on_cpu: bool = True):
    """`array` (of type `name`, in its storage dtype) as compile_program's function on
    `device` (None: jax's default device; `on_cpu`: whether the executor's devices are
    CPUs) takes it: in input_dtype(name, on_cpu), by a view of its bits where that is a
    narrow float's bits. An array in host memory (NumPy, or a jax.Array on a CPU
    device of any client) of ZERO_COPY_MIN_BYTES or more is put on `device` as that same
    memory when it is 64-byte aligned (as XLA's buffers are; NumPy's often are not, and are
    copied); smaller ones the function copies in. An array on an accelerator goes in as it
    is (bitcast there to its bits) when the executor runs on accelerators, else it is
    fetched (a trn2 plugin buffer's value, say)."""
    want = input_dtype(name, on_cpu)
    # An XLA:CPU array of a sub-byte type reports a layout without the packing its
    # computations' parameters have (sub_byte_element_size_in_bits 0, not 4), and jax
    # refuses it as an argument ("compiled for input layouts that disagree"): such an
    # array goes in as its values, which the call packs.
    sub_byte = dtypes.bit_width(dtypes.storage_name(name)) < 8
    if isinstance(array, jax.Array):
        if not on_cpu and any(d.platform != "cpu" for d in array.sharding.device_set):
            return array if array.dtype == want else jax.lax.bitcast_convert_type(array, want)
        if array.dtype == want and not sub_byte and (
                device is None or array.sharding.device_set == {device}
                or array.nbytes < ZERO_COPY_MIN_BYTES and not array.committed):
            return array  # (jax moves an uncommitted array; a committed one must be moved)
    view = np.asarray(array)  # of a jax array on a CPU: a view of its buffer
    if not view.dtype.isnative:  # a view of its bits would read the bytes the wrong way
        view = view.astype(view.dtype.newbyteorder("="))
    view = view if view.dtype == want else view.view(want)
    if device is None or sub_byte:
        return view  # (the jitted function packs sub-byte types as it copies them in)
    if view.nbytes < ZERO_COPY_MIN_BYTES:
        return _copied_to(view, device)
    return jax.device_put(view, device)


def _copied_to(view: np.ndarray, device: jax.Device):
    """A small host array as a copy on `device`, made through DLPack (3 us, where
    jax.device_put takes 40) where NumPy exports its dtype, else the array itself, which
    the jitted function copies in. That copy would count in jaxlib as one of the caller's
    device puts, which jax's tests count (jax._src.test_util.count_internal_device_puts):
    the simulator's own are not the caller's.

    The array is copied here first: jaxlib imports an aligned array's memory rather than
    copying it (whatever DLPack's copy flag says), and the caller may write to theirs
    while the program runs; NumPy also exports neither a read-only nor a strided array."""
    view = np.array(view, order="C")
    try:
        capsule = view.__dlpack__()
    except BufferError:  # a dtype DLPack has no code for (ml_dtypes' narrow floats)
        return view
    return _jax.dlpack_managed_tensor_to_buffer(capsule, device, None, True)


def _from_input(x: jnp.ndarray, value: int, program: isa.Program) -> jnp.ndarray:
    """An input as compile_program's function got it, in its value's storage dtype."""
    storage = dtypes.storage_dtype(program.values[value].type.dtype)
    return x if x.dtype == storage else jax.lax.bitcast_convert_type(x, storage)


def input_shapes(program: isa.Program, global_io: bool) -> list[tuple[int, ...]]:
    """The shapes compile_program's function takes: each input's own shape (global_io) or
    its executor layout."""
    return [program.values[v].type.shape if global_io else program.array_shape(v)
            for v in program.inputs]


def output_shapes(program: isa.Program, global_io: bool,
                  chip_outputs: Sequence[int] = ()) -> list[tuple[int, ...]]:
    """The shapes compile_program's function returns: each output's own shape (global_io;
    its executor layout for those of `chip_outputs`) or its executor layout."""
    program = with_chip_outputs(program, chip_outputs)
    return [program.values[v].type.shape if global_io and i not in chip_outputs
            else program.array_shape(v) for i, v in enumerate(program.outputs)]


def split_over(devices: Sequence[jax.Device], shape: tuple[int, ...],
               within: int | None = None) -> NamedSharding:
    """The sharding of an array of compile_program's function over several `devices`
    (its inputs and outputs alike): split along its first axis (of the first `within`)
    whose size the device count divides (in the executor layout, a mesh axis: each device
    holds the chips of a block of the mesh), else replicated. Over the devices of several
    processes (under jax.distributed), each process holds its devices' shards of it."""
    return split_along(devices, len(shape), next(iter(_splittable(devices, shape, within)),
                                                 None))


def split_along(devices: Sequence[jax.Device], ndim: int, axis: int | None) -> NamedSharding:
    """An array of `ndim` dims over `devices`, split in equal blocks along `axis` (None:
    replicated on each)."""
    mesh = Mesh(np.array(devices), ("executor",))  # (compile_program's `executor`)
    return NamedSharding(mesh, PartitionSpec(*("executor" if d == axis else None
                                               for d in range(ndim))))


def _splittable(devices: Sequence[jax.Device], shape: tuple[int, ...],
                within: int | None = None) -> list[int]:
    """The axes (of the first `within`) an array of `shape` splits along over `devices`
    in equal blocks, first first."""
    return [i for i, n in enumerate(shape[:within]) if n > 1 and n % len(devices) == 0]


def split_covering(devices: Sequence[jax.Device], shape: tuple[int, ...],
                   needs: Sequence[Sequence[Region]],
                   within: int | None = None) -> NamedSharding:
    """The sharding over `devices` of an array of `shape` whose shard on device k holds
    every region of `needs[k]` (index slices into the array): split along the first axis
    (of the first `within`) where that holds, else replicated (each device holds it
    whole). A caller that reads each device's regions of a result from that device's
    shard alone takes it so, and no device holds more of it than a block."""
    for axis in _splittable(devices, shape, within):
        sharding = split_along(devices, len(shape), axis)
        held = sharding.devices_indices_map(shape)
        if all(contains(held[device], region, shape)
               for device, regions in zip(devices, needs) for region in regions):
            return sharding
    return split_along(devices, len(shape), None)


def read_sharding(program: isa.Program, position: int,
                  devices: Sequence[jax.Device]) -> NamedSharding:
    """Where compile_program's function (global_io, over several `devices`) takes input
    `position` of `program` (its own shape): each device the part its chips read. An input
    whose only uses are Shards that split some dim first over the mesh axis the devices
    split the chips along (split_over of the mesh) is split along that dim, so each device
    takes the block of its chips' pieces; any other is replicated, as its chips read all of
    it (or strided blocks of it). Over the devices of several processes, a process given
    only its devices' blocks of such an input then needs no other process's."""
    value = program.inputs[position]
    shape = program.values[value].type.shape
    return split_along(devices, len(shape), _read_dim(program, value, devices))


def _read_dim(program: isa.Program, value: int, devices: Sequence[jax.Device]) -> int | None:
    """The dim of input `value` whose blocks the devices' chips read one each (read_sharding),
    or None."""
    sizes = program.mesh.axis_sizes
    axis = next(iter(_splittable(devices, tuple(sizes))), None)  # the devices' mesh axis
    if axis is None or any(n > 1 for n in program.array_shape(value)[:len(sizes)]):
        return None  # (a varying input is each chip's own: split_over places it)
    users = [instr for instr in program.instructions if value in instr.ins]
    if len(users) != value_uses(program)[value] or \
            not all(isinstance(instr, isa.Shard) for instr in users):
        return None  # read as a whole somewhere (by an op, a sub-program, as an output)
    dims = {next((d for d, axes in enumerate(instr.dim_axes)
                  if [a for a in axes if sizes[a] > 1][:1] == [axis]), None)
            for instr in users}
    return dims.pop() if len(dims) == 1 else None

