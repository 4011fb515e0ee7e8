"""jax_trn2.jit: jax.jit for the simulated Trainium2 mesh.

What jax does, jax does here: tracing and its cache (the compile cache is keyed by jax's
Traced, whose jaxpr jax's trace cache keeps one of per signature: static arguments,
types, weak types, pytree, trace context), lowering to StableHLO (jax's Lowered, for the
trn2 platform's rules, jax_trn2.core.lowerings), what the stages say of the function
(args_info, out_info, donate_argnums, eval_shape), the argument names of errors (jax's
debug info), export (Traced.lower(lowering_platforms=...)), transformations (a call of
jax.jit's function, jax_trn2.frontend.compose), placing results (jax.device_put, jax's
batched placement of the chips' pieces) and naming the shardings XLA chose
(parse_flatten_op_sharding). The compile core (jax_trn2.core) is the plugin's too: the
program, donation (core.donation) and which results come back as the chips' pieces
(core.chip_pieces).

What stays its own, and why:
- A machine per function (topology, rounding, seed, executor_devices): jax.jit compiles
  for the backend of its arguments' devices; these arrays are on the host CPU devices
  that stand for the chips (make_mesh), which XLA:CPU would run. So the compile cache
  holds simulator programs, not jax's XLA executables.
- Global host arrays in and out: arguments as jax.jit takes them without x64 (64-bit
  host arrays narrowed, PRNG keys as their key data, float0 as bools), results placed,
  typed and committed as jax.jit's are. jax names the shardings of results from the
  compiled XLA executable (pxla.maybe_recover_user_shardings); there is none here, so
  the result shardings are named from the program's layouts by the same rules
  (`_recovery_sharding`, `Lowered._shardings`).
- A result's weak type and memory space, set through ArrayImpl's constructor on the
  same buffers: jax has no public way to retype an array without running a computation.
- `_lowering.compile_args` (the arguments jax kept, its in, out and intermediate
  shardings, the context mesh): jax's Lowered has no public accessor for them.
- Deleting donated arguments and refusing one passed twice: jax leaves both to the
  runtime that runs the program (PJRT), which is the simulator here (core.donation).
- jax.jit's dispatch-time errors (a ShapeDtypeStruct called with, an unhashable static
  argument named by position, a Compiled called with other input shardings), and static
  argnums/argnames completed from each other (jax's inference is private).
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import weakref
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax import tree_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, Sharding, \
    SingleDeviceSharding
from jax._src.array import ArrayImpl
from jax._src.literals import TypedNdArray
from jax._src.sharding_impls import parse_flatten_op_sharding
from jax.experimental.layout import Format, Layout

from jax_trn2.frontend import compose
from jax_trn2.core import donation
from jax_trn2.core.chip_pieces import ChipPieces, chip_outputs, pieces_of_output
from jax_trn2.core.executable import LoadedExecutable
from jax_trn2.core.platform import PLATFORM_NAME
from jax_trn2.core import lowerings
from jax_trn2.core.options import PREFIX, ProgramOptions, program_options
from jax_trn2.core.plot import save_plot
from lowering import hlo_sharding, partition
from mesh import isa, numerics
from mesh.machine import Topology
from mesh.memory import MemoryStats

# jax.jit's marker for "no sharding given" (distinct from None: let the partitioner choose).
UNSPECIFIED = inspect.signature(jax.jit).parameters["in_shardings"].default


def _is_key(dtype: Any) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _canonical(leaf: Any, name: str, expected: isa.TensorType) -> Any:
    """An argument as the module takes it: a typed PRNG key array as its key data (uint32);
    a host array or numpy scalar in the type jax.jit takes it as without x64 (float64 ->
    float32, int64 -> int32, wrapping as jax's conversion does). TypeError naming the type
    passed when the converted value is not of the parameter's type."""
    if isinstance(leaf, jax.Array) and _is_key(leaf.dtype):
        return jax.random.key_data(leaf)
    if not isinstance(leaf, (np.ndarray, np.generic)):
        return leaf
    if leaf.dtype == jax.dtypes.float0:  # a zero tangent has no data: jax passes bools
        return np.zeros(leaf.shape, bool)
    canonical = jax.dtypes.canonicalize_dtype(leaf.dtype)
    if canonical == leaf.dtype:
        return leaf
    if canonical.name != expected.dtype or leaf.shape != expected.shape:
        shape = ",".join(map(str, leaf.shape))
        raise TypeError(f"{name}: expected {expected}, got {leaf.dtype.name}[{shape}] (which "
                        f"jax takes as {canonical.name}[{shape}] without jax_enable_x64)")
    return leaf.astype(canonical)


def _check_values(leaves: Sequence[Any]) -> None:
    """jax.jit's error for an argument that describes a value rather than being one."""
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise TypeError(
                f"Argument {i} of shape {leaf.dtype.name}{list(leaf.shape)} of type "
                f"{type(leaf)} is not a valid JAX type: a ShapeDtypeStruct describes an "
                "argument for .trace() or .lower(); a call needs arrays")


def _result(result: Any, aval: Any, sharding: Sharding | None) -> Any:
    """A result of the run as jax.jit returns it: placed, typed and weakly typed as jax's."""
    if aval.dtype == jax.dtypes.float0:  # a zero tangent has no data: host zeros, as jax's
        return TypedNdArray(np.zeros(aval.shape, jax.dtypes.float0), aval=aval)
    return _as_traced(_typed(_placed(result, sharding), aval.dtype), aval)


def _typed(result: Any, dtype: Any) -> Any:
    """A result as jax.jit returns it: key data back into a typed PRNG key array (of the
    key type's implementation; jax has no public accessor for a key dtype's)."""
    return jax.random.wrap_key_data(result, impl=dtype._impl) if _is_key(dtype) else result


def _as_traced(result: Any, aval: Any) -> Any:
    """`result` with the weak type and memory space of jax's trace, as jax.jit's results
    have them: a result of Python scalars only is weak (`lambda x: x * 2` of 3: a weak FP32
    learning rate times BF16 parameters then stays BF16); one placed in host memory by
    out_shardings alone keeps the device memory space of its type, as in jax."""
    if not isinstance(result, ArrayImpl):
        return result
    want = result.aval.update(weak_type=aval.weak_type, memory_space=aval.memory_space)
    if want == result.aval:
        return result
    # the same buffers under that type (a conversion would run a computation per call)
    return ArrayImpl(want, result.sharding, result._arrays, committed=result.committed)



def _default_device() -> jax.Device:
    """Where jax puts an uncommitted array: jax.default_device's, else the first device."""
    device = jax.config.jax_default_device
    if isinstance(device, str):  # a platform name
        return jax.devices(device)[0]
    return device if device is not None else jax.devices()[0]


def _on_a_device(shardings: Sequence[Sharding | None]) -> list[Sharding]:
    """Each sharding, None as jax's default device (where such a leaf is, uncommitted)."""
    default = SingleDeviceSharding(_default_device())
    return [default if s is None else s for s in shardings]


def _formats(avals: Sequence[Any], shardings: Sequence[Sharding]) -> list[Format]:
    """jax Formats of row-major layouts on `shardings`, one per aval."""
    return [Format(Layout(major_to_minor=tuple(range(len(aval.shape))), tiling=()), sharding)
            for aval, sharding in zip(avals, shardings, strict=True)]


def _committed_device(compile_args: dict) -> SingleDeviceSharding | None:
    """The device of the arguments committed to one device, where jax.jit runs the
    program and commits its results."""
    return next((s for s in compile_args.get("in_shardings", ())
                 if isinstance(s, SingleDeviceSharding)), None)


def _recovery_sharding(compile_args: dict) -> tuple[NamedSharding | Mesh | None, int | None]:
    """What jax.jit names the shardings XLA chose with (pxla.maybe_recover_user_shardings),
    and the rank of the argument it is of: the first argument sharding that is a
    NamedSharding (none if it is on one device), else one inside the program (a
    shard_map's), else an out_shardings given, else the mesh of jax.set_mesh."""
    avals = compile_args.get("global_in_avals", ())
    for sharding, aval in zip(compile_args.get("in_shardings", ()), avals):
        if isinstance(sharding, (NamedSharding, SingleDeviceSharding)):
            return (sharding if isinstance(sharding, NamedSharding) else None), aval.ndim
    for group in ("intermediate_shardings", "out_shardings"):
        for sharding in compile_args.get(group) or ():
            if isinstance(sharding, NamedSharding):
                return sharding, None
    context = compile_args.get("context_mesh")
    return (context if isinstance(context, Mesh) and not context.empty else None), None


def _fully_given(sharding: Any) -> bool:
    """Whether `sharding` says where every dim goes: a result type's on a mesh with Auto
    axes leaves dims UNCONSTRAINED, for the partitioner to choose (as it is then chosen)."""
    return isinstance(sharding, Sharding) and not (
        isinstance(sharding, NamedSharding) and P.UNCONSTRAINED in sharding.spec)


def _completed(sharding: NamedSharding, chosen: NamedSharding | None,
               ndim: int) -> NamedSharding:
    """A result type's sharding with its UNCONSTRAINED dims as the partitioner chose them
    (jax's spelling: an entry per dim)."""
    picked = tuple(chosen.spec) if chosen is not None else ()
    spec = [(picked[d] if d < len(picked) else None) if entry is P.UNCONSTRAINED else entry
            for d, entry in enumerate(tuple(sharding.spec) + (None,) * ndim)][:ndim]
    return NamedSharding(sharding.mesh, P(*spec), memory_kind=sharding.memory_kind)


def _spelled_on(mesh: Mesh, dim_axes: tuple, program_mesh: isa.MeshSpec) -> list | None:
    """A layout over `program_mesh` (its devices row-major, as a GSPMD program's mesh is)
    as PartitionSpec entries of `mesh`, the way jax reads XLA's shardings
    (sharding_impls.parse_flatten_op_sharding); None where `mesh` cannot spell it."""
    sizes = program_mesh.axis_sizes
    if not sizes:  # a program of one device: every layout is replicated
        return [None] * len(dim_axes)
    try:
        spec = parse_flatten_op_sharding(hlo_sharding.of_layout(dim_axes, sizes), mesh)[0]
    except (ValueError, StopIteration, NotImplementedError):
        return None
    return list(spec) + [None] * (len(dim_axes) - len(spec))


def _in_memory(sharding: Sharding | None, kind: str | None) -> Sharding | None:
    """`sharding` (None: jax's default device) in memory `kind` where the program names one
    for the result (jax.device_put to pinned_host; "device" in a program that offloads):
    then committed, as jax.jit's result is. As it is otherwise."""
    if kind is None or (sharding is not None and sharding.memory_kind == kind):
        return sharding
    return _on_a_device([sharding])[0].with_memory_kind(kind)


def _chosen_sharding(dim_axes: tuple | None, ndim: int, program_mesh: isa.MeshSpec,
                     recovery: NamedSharding | Mesh | None,
                     recovery_ndim: int | None) -> NamedSharding | None:
    """The NamedSharding jax.jit gives a result of rank `ndim` whose sharding XLA's
    partitioner chose (`dim_axes`: the program's output sharding, mesh axes per dim; None:
    replicated): a PartitionSpec on the recovery sharding's mesh, or that (argument's)
    sharding itself when the result has its rank and is laid out alike, as jax does.
    A GSPMD program's mesh (axes d0, d1, ... over its devices in order) is read onto that
    mesh as jax reads XLA's shardings. None (the result stays on one device) without a
    mesh to name it on, or one of another size, or a layout that mesh cannot spell."""
    mesh = recovery.mesh if isinstance(recovery, NamedSharding) else recovery
    if mesh is None:
        return None
    dims = _spelled_on(mesh, dim_axes or (), program_mesh) \
        if mesh.size == program_mesh.num_devices else None
    if dims is None:
        return None
    while dims and dims[-1] is None:  # jax's spelling: P('a'), not P('a', None)
        dims.pop()
    chosen = NamedSharding(mesh, P(*dims))
    if recovery_ndim == ndim and recovery.is_equivalent_to(chosen, ndim):
        return recovery
    return chosen


def _placed(result: Any, sharding: Sharding | None) -> Any:
    """A result on the mesh's devices as `sharding` lays it out, as jax.jit returns it, so
    that `.sharding`, `jax.typeof` and the programs it is passed to see it so.

    A result in host memory goes as a NumPy view of its buffer: jax puts a NumPy array on
    the devices by slicing it on the host (8 ms for 4 MiB over 64 devices), where it moves
    a jax array with a computation compiled for each sharding (0.1 s, then 0.04 s)."""
    if sharding is None or (isinstance(result, jax.Array) and result.committed
                            and result.sharding == sharding):
        return result
    if isinstance(result, jax.Array) and \
            all(d.platform == "cpu" for d in result.sharding.device_set):
        with jax.enable_x64(True):  # a 64-bit result keeps its type, as the run gave it
            return jax.device_put(np.asarray(result), sharding)
    return jax.device_put(result, sharding)


def _pieces_of_results(executable: LoadedExecutable, avals: Sequence[Any],
                       shardings: Sequence[Sharding | None]) -> list[ChipPieces | None]:
    """Per result leaf, how its devices' buffers are made of its chips' pieces, where the
    core returns it so (jax_trn2.core.chip_pieces) and its placement takes them: not for a
    PRNG key or a zero tangent, whose values are converted."""
    program = executable.program
    chips = set(chip_outputs(program, executable.layouts[1]))
    return [pieces_of_output(program, i, sharding) if i in chips and not _is_key(aval.dtype)
            and aval.dtype != jax.dtypes.float0 else None
            for i, (aval, sharding) in enumerate(zip(avals, shardings, strict=True))]


def _described(leaf: Any) -> Any:
    """An argument as jax traces the function for it: in a job of several processes
    (jax.distributed), a host array or a global array as its type alone. The simulated
    mesh's devices stand in for its chips in each process alone: a global array's
    sharding over the executor's devices says where the simulation keeps its value, not
    how that mesh lays it out, and a host array is the same in every process (where
    jax.jit would refuse a host array for a sharded parameter: it cannot know that)."""
    if jax.process_count() > 1 and (isinstance(leaf, np.ndarray) or isinstance(
            leaf, jax.Array) and not leaf.is_fully_addressable):
        aval = jax.typeof(leaf)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)
    return leaf


def _committed_sharding(leaf: Any) -> Any:
    """The sharding a jax Array brings to jax.jit (it steers partitioning), else None."""
    return leaf.sharding if isinstance(leaf, jax.Array) and leaf.committed else None


def _refuse_unreduced(program: isa.Program) -> None:
    """jax_trn2.jit gives and takes global arrays: a value unreduced along some mesh axes
    (each chip a partial sum, jax's P(unreduced=...)) has no global array of its own. jax's
    arrays on the trn2 devices hold it, a buffer per device."""
    if any(program.input_partials) or any(program.output_partials):
        raise NotImplementedError(
            "jax_trn2.jit does not take or give unreduced values (P(unreduced=...): a "
            "partial sum on each device): run the function with jax.jit on "
            "jax.devices('trn2'), or reduce the value inside it")


def _lowered_for_trn2(traced) -> Any:
    """jax's Lowered of a traced function, lowered as for the trn2 plugin's devices whatever
    the arguments' devices (the CPU's for host arrays): with the trn2 platform's rules
    (jax_trn2.core.lowerings: ragged_dot as a grouped matmul, not the CPU's dense masked
    dot; host callbacks by their global ids in lowerings.CALLBACKS), as jax.jit on
    jax.devices("trn2") lowers it."""
    lowerings.register(PLATFORM_NAME)
    return traced.lower(lowering_platforms=(PLATFORM_NAME,))


def _compile_args(jax_lowered) -> dict:
    """jax's lowering's compile arguments (shardings, meshes, host callbacks); there is no
    public accessor."""
    return getattr(getattr(jax_lowered, "_lowering", None), "compile_args", None) or {}


def _arg_names(traced) -> list[str]:
    """A name for every flattened dynamic argument, from the names jax's trace gives them
    (its debug info: `p['b']`): `argument 'p'['b']`, `argument 5` where it has none."""
    names = traced.jaxpr.jaxpr.debug_info.arg_names or (None,) * len(traced.jaxpr.in_avals)
    return [f"argument {i}" if name is None else
            "argument '{}'{}".format(*re.fullmatch(r"(\w*)(.*)", name).groups())
            for i, name in enumerate(names)]


def _kept_leaves(jax_lowered, module: Any, count: int) -> list[int]:
    """The argument leaves (of `count`) that jax.jit kept as the module's parameters: it
    drops those the function does not use, unless keep_unused (its compile arguments'
    kept_var_idx: jax has no public accessor)."""
    kept = sorted(_compile_args(jax_lowered)["kept_var_idx"])
    parameters = partition.main_parameter_count(module)
    if len(kept) != parameters:
        raise RuntimeError(f"jax kept {len(kept)} of {count} arguments, but its module takes "
                           f"{parameters}: this version of jax is not one jax_trn2 knows")
    return kept


def _program_options(compiler_options: dict | None, topology: str | Topology | None,
                     rounding: str | None, seed: int | None) -> ProgramOptions:
    """jax_trn2.jit's options, read as the plugin reads jax.jit's: `compiler_options`
    (`trn2_*`) and the keywords that say the same, each said one way only."""
    if compiler_options is not None and not isinstance(compiler_options, dict):
        raise TypeError(f"jax_trn2.jit: compiler_options must be a dict, got "
                        f"{compiler_options!r}")
    given = dict(compiler_options or {})
    for name, value in (("topology", topology), ("rounding", rounding), ("seed", seed)):
        if value is not None:
            if PREFIX + name in given:
                raise ValueError(f"jax_trn2.jit: {name}= and compiler option "
                                 f"'{PREFIX}{name}' both given: give one")
            given[PREFIX + name] = value
    return program_options(given)


def _check_hashable(static: tuple) -> None:
    """jax.jit's error for a static argument that cannot key the compilation cache."""
    for where, value in static:
        try:
            hash(value)
        except TypeError as e:
            name = f"argument {where}" if isinstance(where, int) else f"argument '{where}'"
            raise ValueError(
                f"Non-hashable static arguments are not supported. An error occurred while "
                f"trying to hash an object of type {type(value)}, {value!r} (static {name}). "
                f"The error was:\nTypeError: {e}") from None


class _StageInfo:
    """What jax's Traced, Lowered and Compiled stages say of the function's arguments and
    results (the same here: they describe the function, not the machine)."""

    _jax_stage: Any  # jax's stage of the same function

    @property
    def args_info(self) -> Any:
        """The arguments' pytree of jax ArgInfo (shape, dtype, donated)."""
        return self._jax_stage.args_info

    @property
    def out_info(self) -> Any:
        """The results' pytree of jax.ShapeDtypeStruct."""
        return self._jax_stage.out_info

    @property
    def in_avals(self) -> Any:
        return self._jax_stage.in_avals

    @property
    def donate_argnums(self) -> tuple[int, ...]:
        return self._jax_stage.donate_argnums


class Compiled(_StageInfo):
    """A compiled function: call it with the dynamic arguments it was lowered for."""

    def __init__(self, executable: LoadedExecutable, in_tree, out_tree,
                 out_avals: Sequence[Any], out_shardings: Sequence[Any] | None = None,
                 out_pieces: Sequence[ChipPieces | None] | None = None,
                 jax_lowered: Any = None, in_shardings: Sequence[Any] | None = None,
                 kept: Sequence[int] | None = None):
        """`out_shardings`: per result leaf, the NamedSharding jax.jit gives it (its type's
        on an explicit mesh, the out_shardings asked for, or the one XLA's partitioner
        chose), else None (on one device). `out_pieces`: per result leaf, how its devices'
        buffers are made of the chips' pieces the executable returns for it (loaded with
        those chip_outputs), else None. `kept`: the argument leaves the program takes
        (jax.jit drops those the function does not use, unless keep_unused)."""
        self.executable = executable
        self._jax_stage = jax_lowered
        self.in_tree = in_tree
        self.out_tree = out_tree
        self.out_avals = tuple(out_avals)  # each result leaf's dtype and weak type
        self.out_shardings = tuple(out_shardings or (None,) * len(self.out_avals))
        self._out_pieces = tuple(out_pieces or (None,) * len(self.out_avals))
        self._in_shardings = tuple(in_shardings or ())
        program = executable.program
        self._kept = tuple(range(len(program.inputs)) if kept is None else kept)
        self._input_types = [program.values[v].type for v in program.inputs]
        self._donated = donation.donated_inputs(program)

    def __call__(self, *args, **kwargs) -> Any:
        leaves, tree = tree_util.tree_flatten((args, kwargs))
        if tree != self.in_tree:
            raise TypeError(f"arguments have structure {tree}, the function was compiled for "
                            f"{self.in_tree}")
        _check_values(leaves)
        self._check_shardings(leaves)
        return self.call_flat(leaves)

    def _check_shardings(self, leaves: Sequence[Any]) -> None:
        """jax.jit's error for an argument committed to a sharding other than the one the
        function was compiled for (uncommitted arrays are moved, as jax moves them)."""
        if not self._in_shardings:
            return
        expected = _on_a_device(self._in_shardings)
        mismatches = [(k, leaves[i].sharding, expected[i]) for k, i in enumerate(self._kept)
                      if isinstance(leaves[i], jax.Array) and leaves[i].committed and
                      leaves[i].is_fully_addressable and
                      not leaves[i].sharding.is_equivalent_to(expected[i], leaves[i].ndim)]
        if mismatches:
            lines = [f"  {self.executable.arg_names[k]}: got {got}, expected {want}"
                     for k, got, want in mismatches]
            raise ValueError(
                "Compiled object called with input sharding(s) that do not match the "
                "sharding(s) the computation was compiled with (put the arguments there with "
                "jax.device_put, or call the jax_trn2.jit function, which compiles for "
                "them):\n" + "\n".join(lines))

    def runtime_executable(self) -> LoadedExecutable:
        """The executable that runs the program (as jax's is XLA's LoadedExecutable)."""
        return self.executable

    def call_flat(self, leaves: Sequence[Any]) -> Any:
        """Run on the flattened dynamic arguments; returns the output pytree."""
        if len(leaves) == self.in_tree.num_leaves:  # else execute names what is missing
            leaves = [leaves[i] for i in self._kept]
        donation.check_used_once(leaves, self._donated_arrays(leaves),
                                 lambda i: self.executable.arg_names[i])
        if len(leaves) == len(self._input_types):
            leaves = [_canonical(leaf, name, t) for leaf, name, t in
                      zip(leaves, self.executable.arg_names, self._input_types)]
        results = self.executable.execute(leaves, chip_pieces=True)
        # the run has finished (its results were read); memory stays alive for any view
        donation.delete_donated(leaves, self._where_taken(leaves, self._donated_arrays(leaves)))
        return tree_util.tree_unflatten(self.out_tree, [
            _as_traced(pieces.array(r), aval) if pieces is not None else
            _result(r, aval, sharding) for r, aval, sharding, pieces in
            zip(results, self.out_avals, self.out_shardings, self._out_pieces, strict=True)])

    def _donated_arrays(self, leaves: Sequence[Any]) -> list[int]:
        """The donated positions of `leaves` (the ones the program takes) that hold jax
        arrays (a host array jax copies to the devices: the copy is donated)."""
        return [i for i in self._donated if i < len(leaves) and isinstance(leaves[i], jax.Array)]

    def _where_taken(self, leaves: Sequence[Any], positions: Sequence[int]) -> list[int]:
        """The `positions` of `leaves` whose arrays are where the program takes them (its
        in_shardings; none: on one device), as jax.jit deletes them: one elsewhere jax
        copies there and donates the copy, so the caller's stays."""
        return [i for i in positions if not leaves[i].is_deleted() and (
            (sharding := self._in_shardings[self._kept[i]]) is None or
            leaves[i].sharding.is_equivalent_to(sharding, leaves[i].ndim))]

    def _per_argument(self, entries: Sequence[Any], dropped: Any) -> Any:
        """The arguments' pytree of `entries` (one per leaf), `dropped` for the leaves the
        program does not take."""
        kept = set(self._kept)
        return tree_util.tree_unflatten(self.in_tree, [
            entry if i in kept else dropped for i, entry in enumerate(entries)])

    @property
    def input_shardings(self) -> Any:
        """The arguments' pytree of the shardings jax.jit's compiled function takes them
        in (a device of its own where it runs on one; None for one it does not take)."""
        return self._per_argument(_on_a_device(self._in_shardings), None)

    @property
    def output_shardings(self) -> Any:
        """The results' pytree of the shardings they come back with."""
        return tree_util.tree_unflatten(self.out_tree, _on_a_device(self.out_shardings))

    @property
    def input_formats(self) -> Any:
        """The arguments' pytree of jax Formats: row-major layouts (what the executor
        takes), with input_shardings; Format(None, None) for one it does not take."""
        return self._per_argument(_formats(tree_util.tree_leaves(self.in_avals),
                                           _on_a_device(self._in_shardings)),
                                  Format(None, None))

    @property
    def output_formats(self) -> Any:
        """The results' pytree of jax Formats: row-major layouts, with output_shardings."""
        return tree_util.tree_unflatten(self.out_tree, _formats(
            tree_util.tree_leaves(self.out_info), _on_a_device(self.out_shardings)))

    def as_text(self) -> str:
        """The Trn2 program listing with an estimated start and duration on every line,
        and the estimated step time, MFU and engine busy times."""
        return self.executable.timed_text()

    def cost_analysis(self) -> dict:
        """Per-chip 'flops', 'bytes accessed', 'transcendentals' and 'optimal_seconds' (the
        estimated step time), as jax's, plus a 'trn2' breakdown (engines, communication)."""
        return self.executable.cost_analysis()

    def memory_analysis(self, chip: int | None = None) -> MemoryStats:
        """HBM use over one step, per chip, with jax's field names (argument_size_in_bytes,
        output_size_in_bytes, alias_size_in_bytes, temp_size_in_bytes,
        generated_code_size_in_bytes, peak_memory_in_bytes): of the chip with the highest
        peak, or of chip id `chip` of the topology. `live_at_peak` lists the buffers live at
        the peak, largest first (mesh.memory)."""
        return self.executable.memory_analysis(chip)

    def save_trace(self, path, chips=None) -> None:
        """Write the estimated timeline as Chrome trace-event JSON for Perfetto or
        chrome://tracing: one process per chip (all, or the chip ids in `chips`), one thread
        per engine."""
        self.executable.save_trace(path, chips)

    def plot(self, path) -> None:
        """Draw the estimated step into an image file (png, svg, pdf, ...): engines busy
        over time, HBM in use with its peak, and the bytes on each torus link
        (jax_trn2.plot; needs matplotlib: pip install 'jax-trn2[plot]')."""
        save_plot(self.executable.estimate, path)


class Lowered(_StageInfo):
    """A function lowered to StableHLO and then to a Trn2 program."""

    def __init__(self, jax_lowered, executable: LoadedExecutable, in_tree, out_tree,
                 out_avals: Sequence[Any], kept: Sequence[int], check_memory: bool = True):
        """`executable`: the Trn2 program lowered from jax's StableHLO module; `out_avals`: each
        result leaf's abstract value in jax's trace (its dtype and weak type); `kept`: the
        argument leaves the module takes (jax.jit drops unused ones, unless keep_unused);
        `check_memory`: whether compile() checks HBM unless told (jax_trn2.jit's
        trn2_check_memory)."""
        self._jax_stage = jax_lowered
        self._check_memory = check_memory
        self._kept = tuple(kept)
        self._out_avals = tuple(out_avals)
        self._executable = executable
        self.in_tree = in_tree
        self.out_tree = out_tree

    @property
    def program(self):
        """The Trn2 program (mesh.isa.Program)."""
        return self._executable.program

    def as_text(self, dialect: str = "trn2", *, debug_info: bool = False) -> str:
        """The Trn2 program listing (with each instruction's source line), or the module jax
        emitted: dialect="stablehlo", or "hlo" (XLA's HLO text of it), with its locations
        when `debug_info`."""
        if dialect in ("stablehlo", "hlo"):
            return self._jax_stage.as_text(dialect, debug_info=debug_info)
        if dialect != "trn2":
            raise ValueError(f"dialect must be 'trn2', 'stablehlo' or 'hlo', got {dialect!r}")
        return self._executable.as_text()

    def compiler_ir(self, dialect: str = "stablehlo"):
        return self._jax_stage.compiler_ir(dialect)

    def cost_analysis(self) -> dict:
        """The estimated per-chip costs (as Compiled.cost_analysis), without compiling."""
        return self._executable.cost_analysis()

    def memory_analysis(self, chip: int | None = None) -> MemoryStats:
        """The per-chip HBM use (as Compiled.memory_analysis), without compiling: works on
        a program too large for the chip."""
        return self._executable.memory_analysis(chip)

    def compile(self, compiler_options: dict | None = None, *,
                check_memory: bool | None = None) -> Compiled:
        """Compile the Trn2 program's executor for the host (one XLA computation).

        Raises jax_trn2.OutOfHBMError when the program needs more HBM on some chip than the
        chip has (as XLA fails with RESOURCE_EXHAUSTED), saying which chips and what fills
        them; `check_memory=False` (or compiler option `trn2_check_memory`, as for jax.jit
        on the plugin) compiles it anyway (it still runs on the simulator). The program's
        machine and rounding were fixed when it was lowered: `compiler_options` that
        change them are refused, as are XLA's."""
        executable = self._executable
        if check_memory is not None and PREFIX + "check_memory" in (compiler_options or {}):
            raise ValueError("Lowered.compile: check_memory given twice (the keyword and "
                             "compiler option trn2_check_memory)")
        fixed = ProgramOptions(executable.rounding, self._check_memory, executable.topology)
        options = program_options(compiler_options or {}, fixed)
        if (options.rounding, options.topology) != (fixed.rounding, fixed.topology):
            raise ValueError("Lowered.compile: the program was lowered for its machine and "
                             "rounding (trn2_topology, trn2_rounding, trn2_seed): give them to "
                             "jax_trn2.jit instead")
        out_shardings, out_pieces = self._placed_results
        executable.load(options.check_memory if check_memory is None else check_memory)
        in_avals = tree_util.tree_leaves(self.in_avals)
        compile_args = _compile_args(self._jax_stage)
        in_layouts, _ = executable.layouts
        return Compiled(executable, self.in_tree, self.out_tree, self._out_avals,
                        out_shardings, out_pieces, self._jax_stage,
                        self._shardings(compile_args, [a.ndim for a in in_avals],
                                        self._of_all_leaves(in_layouts, len(in_avals)),
                                        self._of_all_leaves(compile_args.get("in_shardings"),
                                                            len(in_avals))),
                        self._kept)

    @functools.cached_property
    def _placed_results(self) -> tuple[list[Sharding | None], list[ChipPieces | None]]:
        """Per result leaf, the sharding jax.jit gives it and how its devices' buffers are
        made of its chips' pieces (else None). Fixes which outputs the executable returns
        as chip pieces (LoadedExecutable.return_chip_pieces), before it compiles: compile
        and prefetch_workspace ask for this first."""
        executable = self._executable
        _refuse_unreduced(executable.program)
        out_info = tree_util.tree_leaves(self._jax_stage.out_info)
        _, out_layouts = executable.layouts
        # XLA replicates a result with no elements, whatever its layout said
        out_layouts = [None if 0 in i.shape else layout for i, layout in
                       zip(out_info, out_layouts or (None,) * len(out_info), strict=True)]
        shardings = [_in_memory(sharding, kind) for sharding, kind in zip(
            self._shardings(_compile_args(self._jax_stage), [len(i.shape) for i in out_info],
                            out_layouts, [getattr(i, "sharding", None) for i in out_info]),
            partition.result_memory_kinds(executable.module), strict=True)]
        if executable.spans_processes:
            # global arrays where the run leaves them: the mesh's devices stand in for the
            # chips in each process alone, so the executor's devices hold them
            shardings = list(executable.result_shardings)
        pieces = _pieces_of_results(executable, self._out_avals, shardings)
        executable.return_chip_pieces([i for i, p in enumerate(pieces) if p is not None])
        return shardings, pieces

    def prefetch_workspace(self) -> None:
        """Start making the workspace of a call about to run (LoadedExecutable's)."""
        _ = self._placed_results  # which results come as chip pieces: the workspace's too
        self._executable.prefetch_workspace()

    def _of_all_leaves(self, per_kept: Sequence[Any] | None, count: int) -> list[Any]:
        """Per argument leaf, the entry of the kept leaf, None for a dropped one."""
        entries = [None] * count
        for i, entry in zip(self._kept, per_kept or ()):
            entries[i] = entry
        return entries

    def _shardings(self, compile_args: dict, ndims: Sequence[int], layouts: tuple,
                   given: Sequence[Any]) -> list[Sharding | None]:
        """The sharding jax.jit gives each leaf (of ranks `ndims`): the one `given` (the
        out_shardings asked for or a result type's, an argument's committed sharding or
        in_shardings), else the one XLA chose (`layouts`: dim_axes per leaf), else (a
        program on one device) the device its committed arguments are on, else None (jax's
        default device, uncommitted)."""
        program = self._executable.program
        recovery, recovery_ndim = _recovery_sharding(compile_args)
        device = _committed_device(compile_args)
        layouts = layouts or (None,) * len(ndims)
        shardings = []
        for ndim, dim_axes, g in zip(ndims, layouts, given, strict=True):
            if _fully_given(g):
                shardings.append(g)
                continue
            chosen = _chosen_sharding(dim_axes, ndim, program.mesh, recovery, recovery_ndim)
            if isinstance(g, NamedSharding):  # a result type's, with UNCONSTRAINED dims
                shardings.append(_completed(g, chosen, ndim))
            else:
                shardings.append(chosen or device)
        return shardings


class Traced(_StageInfo):
    """A traced function (jax.jit's `Traced` stage): its jaxpr and what it takes and gives;
    `lower()` lowers it for the simulated mesh."""

    def __init__(self, jitted: "Jitted", jax_traced: Any):
        self._jitted = jitted
        self._jax_stage = jax_traced

    @property
    def jaxpr(self) -> Any:
        """The function's jax.core.ClosedJaxpr."""
        return self._jax_stage.jaxpr

    @property
    def fun_name(self) -> str:
        return self._jax_stage.fun_name

    def stablehlo(self) -> Any:
        """The global StableHLO module (a jaxlib ir.Module) jax lowers the function to for
        the trn2 devices, before XLA's partitioner splits it (lowering.partitioned_module)
        and it is lowered to a Trn2 program."""
        return self._jax_lowered.compiler_ir("stablehlo")

    @functools.cached_property
    def _jax_lowered(self) -> Any:
        return _lowered_for_trn2(self._jax_stage)

    def lower(self, *, lowering_platforms: tuple[str, ...] | None = None,
              _private_parameters: Any = None) -> Any:
        """Lower to a Trn2 program (mesh.isa) for the simulated mesh.

        With `lowering_platforms` (as jax.export passes it), jax's own Lowered of the
        function instead: so `jax.export.export(jax_trn2.jit(f))` exports the function's
        StableHLO, which this simulator (jax_trn2.client().compile) or any other backend
        can run."""
        if lowering_platforms is not None:
            return self._jax_stage.lower(lowering_platforms=lowering_platforms,
                                         _private_parameters=_private_parameters)
        return self._jitted._lower_traced(self._jax_stage, self._jax_lowered)


# The programs compiled for each function, by the jax_trn2.jit options they were compiled
# with: every jax_trn2.jit of the same function with the same options shares them (as
# jax.jit's caches are shared), for as long as the function lives.
_PROGRAMS: "weakref.WeakKeyDictionary[Callable, dict]" = weakref.WeakKeyDictionary()


def _programs_of(fun: Callable, options: tuple) -> dict[Any, "Compiled"]:
    """The compiled-program cache of `fun` under `options` (a cache of its own for a
    function or options that cannot key one: not weakly referable, or unhashable)."""
    try:
        hash(options)
        return _PROGRAMS.setdefault(fun, {}).setdefault(options, {})
    except TypeError:
        leaves, tree = tree_util.tree_flatten(options)
        try:
            return _PROGRAMS.setdefault(fun, {}).setdefault((tree, tuple(leaves)), {})
        except TypeError:
            return {}


class Jitted:
    """A function compiled for the simulated mesh on first call for each argument
    signature (shapes, dtypes, weak types, pytree structure and static arguments)."""

    def __init__(self, fun: Callable, static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = (),
                 options: ProgramOptions = ProgramOptions(),
                 executor_devices: Sequence[jax.Device] | None = None, **jit_options):
        """`options`: the simulated machine's program options (the plugin's, from
        jax_trn2.jit's keywords and compiler_options); the rest as for jax_trn2.jit."""
        # name and docstring only: the function's own attributes (a jax.pmap function's
        # `lower`, say) must not shadow this object's methods
        functools.update_wrapper(self, fun, updated=())
        self._fun = fun
        self.options = options
        self._executor_devices = executor_devices
        try:
            self._params = list(inspect.signature(fun).parameters.values())
        except (TypeError, ValueError):
            self._params = []
        self._static_argnums, self._static_argnames = self._statics(static_argnums,
                                                                    static_argnames)
        self._jax_jit = jax.jit(fun, static_argnums=self._static_argnums,
                                static_argnames=self._static_argnames, **jit_options)
        # as given (a prefix of the dynamic arguments' pytree): what a planner reads to
        # bound the arguments' bytes per device before tracing
        self.in_shardings = jit_options.get("in_shardings", UNSPECIFIED)
        self._cache = _programs_of(fun, (self._static_argnums, self._static_argnames,
                                         options, executor_devices,
                                         tuple(sorted(jit_options.items()))))

    @property
    def rounding(self) -> numerics.Rounding:
        """How the function's programs round to BF16/FP16/FP8 (mesh.numerics)."""
        return self.options.rounding

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """As a method (`@jax_trn2.jit` on a `def f(self, x)`), bound to the instance, as
        jax.jit's functions are (self is then a static or array argument like any other)."""
        return self if instance is None else types.MethodType(self, instance)

    def _statics(self, argnums, argnames) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """Static positions and names, each completed from the other through the signature
        (as jax.jit does)."""
        argnums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        argnames = (argnames,) if isinstance(argnames, str) else tuple(argnames)
        positional = [p.name for p in self._params
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        argnums += tuple(positional.index(n) for n in argnames
                         if n in positional and positional.index(n) not in argnums)
        argnames += tuple(positional[i] for i in argnums
                          if 0 <= i < len(positional) and positional[i] not in argnames)
        return argnums, argnames

    def _split(self, args: tuple, kwargs: dict):
        """(static part of the call, dynamic args, dynamic kwargs)."""
        nums = {i if i >= 0 else i + len(args) for i in self._static_argnums}
        static = tuple((i, a) for i, a in enumerate(args) if i in nums) + \
            tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_argnames))
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_argnames}
        return static, dyn_args, dyn_kwargs

    def eval_shape(self, *args, **kwargs) -> Any:
        """The results' pytree of jax.ShapeDtypeStruct, without lowering (jax.jit's)."""
        return self._jax_jit.eval_shape(*args, **kwargs)

    def clear_cache(self) -> None:
        """Forget the programs compiled so far (the next call lowers and compiles again)."""
        self._cache.clear()
        self._jax_jit.clear_cache()

    @property
    def jax_function(self) -> Callable:
        """`jax.jit` of the same function with the same static arguments (for references)."""
        return self._jax_jit

    def dynamic_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The arguments of a call that are not static: what the compiled program takes."""
        _, dyn_args, dyn_kwargs = self._split(args, kwargs)
        return dyn_args, dyn_kwargs

    def __call__(self, *args, **kwargs) -> Any:
        static, dyn_args, dyn_kwargs = self._split(args, kwargs)
        _check_hashable(static)
        leaves, tree = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        _check_values(leaves)
        if compose.is_traced(leaves):  # under a JAX transformation (jax_trn2.frontend.compose)
            # the function called is jax.jit's, so that its in/out shardings and their
            # checks hold in the transformed computation too (which XLA then partitions)
            return compose.call_traced(self._jax_jit, dict(static), leaves, tree,
                                       self.options, self._executor_devices)
        # keyed by jax's trace, which jax's trace cache keeps one of per signature (static
        # arguments, types, weak types, pytree, and its trace context: the mesh of
        # jax.set_mesh, x64, ...), and by the shardings committed arguments bring; traced
        # for the arguments as _described gives them (their types, across processes)
        traced = self._traced_for(args, kwargs)
        key = (traced.jaxpr, tuple(_committed_sharding(_described(leaf)) for leaf in leaves))
        compiled = self._cache.get(key)
        if compiled is None:
            lowered = self._lower_traced(traced)
            lowered.prefetch_workspace()  # a call runs next: made meanwhile
            compiled = lowered.compile()
            self._cache[key] = compiled
        return compiled.call_flat(leaves)

    def trace(self, *args, **kwargs) -> "Traced":
        """Trace for these arguments (arrays or jax.ShapeDtypeStruct), as jax.jit's `trace`:
        the jaxpr, without lowering."""
        return Traced(self, self._traced_for(args, kwargs))

    def _traced_for(self, args: tuple, kwargs: dict) -> Any:
        """jax's Traced stage of the function for these arguments, as _described gives
        them."""
        described_args, described_kwargs = tree_util.tree_map(_described, (args, kwargs))
        return self._jax_jit.trace(*described_args, **described_kwargs)

    def lower(self, *args, **kwargs) -> Lowered:
        """Trace and lower for these arguments (arrays or jax.ShapeDtypeStruct)."""
        return self.trace(*args, **kwargs).lower()

    def _lower_traced(self, traced, jax_lowered: Any = None) -> Lowered:
        """Lower jax's Traced stage of the function for the simulated mesh (`jax_lowered`:
        its jax Lowered for trn2, when made already)."""
        jax_lowered = jax_lowered or _lowered_for_trn2(traced)
        module = jax_lowered.compiler_ir("stablehlo")
        names = _arg_names(traced)
        kept = _kept_leaves(jax_lowered, module, len(names))
        executable = LoadedExecutable.from_stablehlo(
            self.options.topology, module, arg_names=[names[i] for i in kept],
            rounding=self.options.rounding, executor_devices=self._executor_devices,
            host_callbacks=lowerings.CALLBACKS)
        return Lowered(jax_lowered, executable, jax_lowered.in_tree, jax_lowered.out_tree,
                       traced.jaxpr.out_avals, kept, self.options.check_memory)


def jit(fun: Callable | None = None, *, in_shardings: Any = UNSPECIFIED,
        out_shardings: Any = UNSPECIFIED, static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
        donate_argnums: int | Sequence[int] | None = None,
        donate_argnames: str | Sequence[str] | None = None, keep_unused: bool = False,
        device: jax.Device | None = None, backend: str | None = None, inline: bool = False,
        compiler_options: dict[str, Any] | None = None,
        topology: str | Topology | None = None, rounding: str | None = None,
        seed: int | None = None, executor_devices: Sequence[jax.Device] | None = None):
    """Like `jax.jit`, but runs on the simulated Trainium2 mesh.

    Pytrees in and out, keyword arguments, static arguments, and a compiled-program cache
    keyed like jax.jit's. `topology` (a preset name or a Topology) defaults to the one the
    mesh was made for by `jax_trn2.make_mesh` (otherwise the preset with as many chips as
    the mesh has devices; trn2-ultra for a program without a mesh). Usable as `@jit` or
    `@jit(...)`.

    `in_shardings`, `out_shardings`, `donate_argnums` and `donate_argnames` have jax.jit's
    meaning (either donation argument alone also donates the same arguments passed the
    other way, by position or by name; NamedShardings over a make_mesh mesh, PartitionSpecs under
    `jax.set_mesh(mesh)`, pytree prefixes, None to let the partitioner choose). A program
    with shardings outside shard_map bodies (these, `with_sharding_constraint`, sharding in
    types) is partitioned by XLA's SPMD partitioner, and each chip runs its partitioned
    program, with the collectives the partitioner inserted (lowering.partition).

    `rounding` says how results are rounded to BF16/FP16/FP8: "nearest" (round-to-nearest-
    even, the hardware default) or "stochastic" (Trainium2's opt-in stochastic rounding,
    random bits from `seed`, default 0: the same seed reproduces the same results, call
    after call). See mesh.numerics for the arithmetic model.

    `compiler_options` are those of jax.jit on the trn2 plugin's devices, read by the same
    code (jax_trn2.core.options): `trn2_topology`, `trn2_rounding` and `trn2_seed` say
    what the keywords above say (give each one way only), `trn2_check_memory=False`
    compiles a program that does not fit a chip's HBM; XLA's options raise ValueError (XLA
    does not compile the program here).

    `executor_devices` (e.g. `jax.devices()`: several GPUs, or the devices of several hosts
    joined with jax.distributed) run the one simulation together, its arrays split along
    the mesh axes; results are bit-identical to a run on one device but where a sum's
    order is XLA:CPU's (mesh.executor.compile_program). Over the devices of several
    processes, every process calls the function with the same host arrays (or global
    jax arrays), and gets global jax arrays over those devices, holding its own devices'
    shards, as jax.jit's multi-controller programs do (docs/plugin.md).

    jax.jit's other keywords: `keep_unused`, `inline` and `device`/`backend` (deprecated in
    jax: the device the results are committed to) have jax.jit's meaning.
    """
    options = _program_options(compiler_options, topology, rounding, seed)
    jit_options = dict(in_shardings=in_shardings, out_shardings=out_shardings,
                       donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                       keep_unused=keep_unused, inline=inline, device=device, backend=backend)
    if fun is None:
        return functools.partial(jit, static_argnums=static_argnums,
                                 static_argnames=static_argnames,
                                 compiler_options=compiler_options, topology=topology,
                                 rounding=rounding, seed=seed,
                                 executor_devices=executor_devices, **jit_options)
    return Jitted(fun, static_argnums, static_argnames, options, executor_devices,
                  **jit_options)


def _run_on_mesh(fun: Any, *args, name: str, options: ProgramOptions,
                 executor_devices: tuple[Any, ...] | None):
    """Evaluate a trn2_call: compile the (possibly transformed) function for the mesh and
    run it. A transformed function records what its transformation needs when traced, so
    each evaluation traces it exactly once (no compilation cache across calls)."""
    def flat(*flat_args):
        return list(fun.call_wrapped(*flat_args))

    flat.__name__ = name
    # Under `jax.vmap` with an `axis_name` the call is evaluated inside the vmap's axis
    # environment: the function is traced in it (its collectives over the vmapped axis
    # name it), and the program, which names no outer axis, runs as every program does,
    # at jax's top level (jax_trn2.core.executable._executor_context).
    return Jitted(flat, options=options,
                  executor_devices=executor_devices).lower(*args).compile()(*args)


compose.trn2_call_p.def_impl(_run_on_mesh)
