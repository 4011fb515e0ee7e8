"""The StableHLO walker: value environment, op decoding and dispatch to rules.

Rules see an `Op` (operand value ids, TensorTypes, lazily decoded attributes, opaque region
handles, the user's source location) and a `LoweringContext` to emit instructions with; they
never see an MLIR object. A missing rule is a hard error naming the op and its source line.
"""

from __future__ import annotations

import itertools

from collections.abc import Iterator, Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from jaxlib.mlir import ir

from lowering import hlo_sharding, inserted, mlir, partition
from lowering.dynamic_shapes import SHAPE_OPERANDS
from lowering.errors import LoweringError, UnsupportedOpError, located
from lowering.registry import MEMORY_NEUTRAL, RULES
from lowering.replica_groups import ProcessGrid
from mesh import isa

TERMINATORS = frozenset({"func.return", "stablehlo.return", "sdy.return"})


@dataclass(frozen=True)
class Region:
    """An op's region, to hand back to the context (inline it or make a sub-program)."""

    _region: Any

    @property
    def block(self):
        return self._region.blocks[0]

    @property
    def arg_types(self) -> tuple[isa.TensorType | mlir.TupleType, ...]:
        """The block arguments' types (tokens as TensorType, tuples as TupleType)."""
        return tuple(mlir.value_type(a.type) for a in self.block.arguments)


# The name jax gives, in the name stack, the ops that recompute what jax.checkpoint did
# not keep (jax._src.interpreters.partial_eval's remat).
REMAT_SCOPE = "rematted_computation"


@dataclass(frozen=True)
class Op:
    """A decoded StableHLO op."""

    name: str
    operands: tuple[int, ...]
    operand_types: tuple[isa.TensorType, ...]
    result_types: tuple[isa.TensorType, ...]
    attrs: Mapping[str, Any]
    regions: tuple[Region, ...]
    loc: str
    scope: str = ""  # jax's name stack: `jit(step)/dot_general`
    user_scope: str = ""  # the user's scopes in it, callers' first: `Model/block0/attn/q`
    via: str = ""  # the library line inside the user's line `loc` that made the op

    @property
    def short_name(self) -> str:
        return self.name.split(".", 1)[-1]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs[name] if name in self.attrs else default

    @property
    def backend_config(self) -> dict:
        """A typed-FFI custom call's configuration: StableHLO's `backend_config` dictionary
        (as XLA's HLO converts to), or jax's own spelling `mhlo.backend_config`."""
        for name in ("mhlo.backend_config", "backend_config"):
            if isinstance(self.attrs.get(name), dict):
                return self.attrs[name]
        return {}


class ProgramBuilder:
    """Collects instructions and value infos of one program."""

    def __init__(self, mesh: isa.MeshSpec, ids: Iterator[int] | None = None):
        self.mesh = mesh
        self.instructions: list[isa.Instruction] = []
        self.values: dict[int, isa.ValueInfo] = {}
        self.known: dict[int, np.ndarray] = {}  # values known while lowering (lowering.folding)
        self._ids = itertools.count() if ids is None else ids

    def child(self) -> "ProgramBuilder":
        """A builder for a sub-program on the same mesh whose value ids never clash with
        this program's."""
        return ProgramBuilder(self.mesh, self._ids)

    def new_value(self, type_: isa.TensorType, varying: frozenset[int]) -> int:
        vid = next(self._ids)
        self.values[vid] = isa.ValueInfo(type_, frozenset(varying))
        return vid

    def program(self, inputs: Sequence[int], outputs: Sequence[int], name: str,
                **shardings) -> isa.Program:
        return isa.Program(self.mesh, tuple(self.instructions), tuple(inputs), tuple(outputs),
                           dict(self.values), name, **shardings)


class LoweringContext:
    """What a rule may do: look at values, emit instructions, lower the op's regions."""

    def __init__(self, walker: "Walker", builder: ProgramBuilder,
                 env: Mapping[Any, int] | None = None):
        self.walker = walker
        self.builder = builder
        self.env = env if env is not None else {}  # MLIR values in scope -> value ids

    @property
    def mesh(self) -> isa.MeshSpec:
        return self.builder.mesh

    @property
    def grid(self) -> ProcessGrid:
        """How StableHLO's replicas and partitions lie on the mesh (partition_id, replica_id,
        and the replica_groups of collectives refer to them)."""
        return self.walker.grid

    def type(self, value: int) -> isa.TensorType:
        return self.builder.values[value].type

    def varying(self, value: int) -> frozenset[int]:
        return self.builder.values[value].varying

    def emit(self, cls: type, op: Op, /, ins: Sequence[int] | None = None,
             out_types: Sequence[isa.TensorType] | None = None,
             varying: frozenset[int] | None = None,
             out_layouts: Sequence[frozenset[int]] | None = None, **params) -> tuple[int, ...]:
        """Emit one instruction; outputs vary along the union of the inputs' axes unless
        `varying` says otherwise (or `out_layouts`, one layout per output)."""
        ins = tuple(op.operands if ins is None else ins)
        out_types = tuple(op.result_types if out_types is None else out_types)
        if varying is None:
            varying = frozenset().union(*(self.varying(v) for v in ins))
        layouts = [varying] * len(out_types) if out_layouts is None else list(out_layouts)
        outs = tuple(self.builder.new_value(t, v) for t, v in zip(out_types, layouts, strict=True))
        self.builder.instructions.append(cls(outs, ins, loc=op.loc, scope=op.user_scope,
                                             via=op.via, recomputed=REMAT_SCOPE in op.scope,
                                             **params))
        return outs

    def inline_region(self, region: Region, args: Sequence[int]) -> list[int]:
        """Lower a region's block in place, its arguments bound to `args`."""
        return self.walker.lower_block(region.block, args, self.builder)

    def call(self, function: str, args: Sequence[int], caller: Op) -> list[int]:
        """Inline a function called by op `caller`: its ops are in the caller's scope, and
        those without a user source line are reported at the caller's."""
        self.walker.callers.append(caller)
        try:
            return self.walker.lower_block(self.walker.function_block(function), args,
                                           self.builder)
        finally:
            self.walker.callers.pop()

    def function_program(self, function: str, args: Sequence[int], name: str,
                         caller: Op) -> isa.Program:
        """A function as a sub-program over this program's mesh whose inputs have the
        types and layouts of `args` (a composite's decomposition), called by op `caller`
        (as in `call`)."""
        builder = self.builder.child()
        inputs = [builder.new_value(self.type(a), self.varying(a)) for a in args]
        self.walker.callers.append(caller)
        try:
            outputs = self.walker.lower_block(self.walker.function_block(function), inputs,
                                              builder)
        finally:
            self.walker.callers.pop()
        return builder.program(inputs, outputs, name)

    def scalar_program(self, region: Region, name: str) -> isa.Program:
        """A region as a separate program with no mesh dims (a reducer or comparator body)."""
        builder = ProgramBuilder(isa.MeshSpec((), ()))
        inputs = [builder.new_value(t, frozenset()) for t in region.arg_types]
        outputs = self.walker.lower_block(region.block, inputs, builder,
                                          self._captured_constants(region, builder, name))
        return builder.program(inputs, outputs, name)

    def _captured_constants(self, region: Region, builder: ProgramBuilder,
                            name: str) -> dict[Any, int]:
        """The values a region with no mesh dims uses from outside it, made in `builder`:
        constants, which MLIR's canonicalisation hoists out of regions (as in the modules
        jaxlib serializes for a PJRT plugin); LoweringError for any other value."""
        captured: dict[Any, int] = {}
        ctx = LoweringContext(self.walker, builder, captured)
        for value in _free_values([region._region]):
            owner = value.owner if isinstance(value, ir.OpResult) else None
            if owner is None or owner.name != "stablehlo.constant":
                raise LoweringError(f"the {name} region uses {value.get_name()}, defined "
                                    "outside it and not a constant: a reducer or comparator "
                                    "may use only its arguments and constants")
            (captured[value],) = self.walker._apply_rule(ctx, self.walker._decode(owner, {}),
                                                         owner)
        return captured

    def sub_programs(self, regions: Sequence[Region], arg_layouts: Sequence[frozenset[int]],
                     names: Sequence[str]) -> tuple[list[isa.Program], tuple[int, ...]]:
        """Regions of one op (a loop's cond and body, a conditional's branches) as separate
        programs over this program's mesh.

        Each program takes its block's arguments, with layouts `arg_layouts`, followed by the
        values of the enclosing scope that any of the regions uses (StableHLO regions may use
        values defined outside them); returns the programs and those captured value ids.
        Value ids stay unique across the enclosing program and its sub-programs.
        """
        free = _free_values([r._region for r in regions])
        captured = tuple(leaf for v in free for leaf in leaves(self.env[v]))  # tuples: leaves
        programs = []
        for region, name in zip(regions, names, strict=True):
            if len(region.arg_types) != len(arg_layouts):
                raise LoweringError(f"internal: region {name} has {len(region.arg_types)} "
                                    f"arguments, given {len(arg_layouts)} layouts")
            builder = self.builder.child()
            args = [builder.new_value(t, v) for t, v in zip(region.arg_types, arg_layouts)]
            outer = {v: map_leaves(self.env[v], lambda c: builder.new_value(
                self.type(c), self.varying(c))) for v in free}
            outputs = self.walker.lower_block(region.block, args, builder, outer)
            inner = [leaf for value in outer.values() for leaf in leaves(value)]
            programs.append(builder.program(args + inner, outputs, name))
        return programs, captured

    def constant_value(self, value: int) -> np.ndarray | None:
        """The per-chip value of `value` when a Constant of this program defines it."""
        for instr in reversed(self.builder.instructions):
            if value in instr.outs:
                if isinstance(instr, isa.Constant) and \
                        np.shape(instr.value) == self.type(value).shape:
                    return np.asarray(instr.value)
                return None
        return None


class Walker:
    """Lowers one StableHLO module to a Trn2 `Program`."""

    def __init__(self, module: ir.Module, mesh: isa.MeshSpec | None = None,
                 host_callbacks: Sequence[Any] | None = None,
                 module_name: str = mlir.MODULE_TEXT):
        """`mesh`: the user's mesh of a per-chip program XLA's partitioner made
        (lowering.partition), whose own sdy.mesh has lost the axis names.
        `host_callbacks`: the Python functions of the module's host callbacks, by the index
        their custom calls carry (jax keeps them beside the lowered module).
        `module_name`: the module text's file, where ops without debug locations are."""
        self.module = module
        self.module_name = module_name
        self.host_callbacks = host_callbacks
        self.functions: dict[str, Any] = {}
        # The ops of the functions being inlined (func.call), outermost first: jax names the
        # ops of a function it lowers out of line without its callers' scopes.
        self.callers: list[Op] = []
        meshes: dict[str, isa.MeshSpec] = {}
        for op in module.body.operations:
            op = op.operation  # the generic op (a FuncOp view's .name is its symbol)
            attrs = mlir.Attributes(op)
            if op.name == "func.func":
                self.functions[attrs["sym_name"]] = op
            elif op.name == "sdy.mesh":
                meshes[attrs["sym_name"]] = mlir.mesh_spec(op)
                if mlir.mesh_device_ids(op) is not None and not partition.is_partitioned(
                        module):  # (lowering.lower has XLA's partitioner place them)
                    raise LoweringError(f"sdy.mesh @{attrs['sym_name']} lists its devices "
                                        "in another order: lower XLA's partitioned program "
                                        "of this module (lowering.lower does)")
        if "main" not in self.functions:
            raise LoweringError("the module has no public function 'main'")
        self.sdy_meshes = dict(meshes)  # by symbol name, for replica groups named by axes
        self.partitioned = partition.is_partitioned(module)
        self.argument_names: dict[int, str] = {}  # main's inputs -> names, when partitioned
        if self.partitioned:  # each chip's program: arguments are the chip's pieces
            if mesh is None:
                mesh = hlo_sharding.module_mesh(module) or isa.MeshSpec((), ())
            meshes = {"": mesh}
        if not any(m.rank for m in meshes.values()):  # a GSPMD program names its mesh only
            gspmd_mesh = hlo_sharding.module_mesh(module)  # through its shardings
            if gspmd_mesh is not None:
                meshes[hlo_sharding.SHARDING_ATTR] = gspmd_mesh
        # HloShardings that Sharding custom calls put on values, for SPMDFullToShardShape.
        self.value_shardings: dict[int, str] = {}
        # Values held in host memory (main's arguments in pinned_host or unpinned_host, their
        # pieces, offloads' results) -> their memory kind; the rest are in HBM.
        self.host_values: dict[int, str] = {}
        self.reloads: dict[tuple[int, int], int] = {}  # (builder, host value) -> in HBM
        self.grid = _process_grid(meshes, mlir.Attributes(module.operation))
        self.mesh = self.grid.mesh
        # Without an sdy.mesh, main is the code each process runs on its own arguments
        # (SPMD), so they vary along every mesh axis; with one, they are global values.
        self.argument_layout = frozenset() if any(m.rank for m in meshes.values()) \
            else frozenset(range(self.mesh.rank))

    def module_mesh(self, name: str) -> isa.MeshSpec:
        """The module's sdy.mesh `name` (replica groups may name its axes)."""
        try:
            return self.sdy_meshes[name]
        except KeyError:
            raise LoweringError(f"replica groups name the mesh @{name}, which the module does "
                                "not define") from None

    def function_block(self, name: str):
        try:
            return self.functions[name].regions[0].blocks[0]
        except KeyError:
            raise LoweringError(f"the module has no function @{name}") from None

    def lower(self) -> isa.Program:
        if self.partitioned:
            return self._lower_partitioned()
        builder = ProgramBuilder(self.mesh)
        block = self.function_block("main")
        # A tuple-typed argument or result is passed as its leaves, in order (PJRT's
        # untupled arguments and results).
        # Tokens (ordered effects) are made inside, not passed: jax's callers never see them.
        arguments = [_token(builder) if mlir.is_token(a.type) else
                     values_of(_argument_type(i, a), lambda t: builder.new_value(
                         t, self.argument_layout)) for i, a in enumerate(block.arguments)]
        inputs = [leaf for argument, a in zip(arguments, block.arguments)
                  if not mlir.is_token(a.type) for leaf in leaves(argument)]
        input_kinds = self._host_memory_kinds("arg_attrs", block.arguments, inputs)
        results = self.lower_block(block, arguments, builder)
        returned = list(_terminator(block).operands)
        output_kinds = self._host_memory_kinds("res_attrs", returned)
        outputs = [self._placed(builder, leaf, kind) for leaf, kind in zip(
            [leaf for result, v in zip(results, returned) if not mlir.is_token(v.type)
             for leaf in leaves(result)], output_kinds or itertools.repeat(None))]
        main = mlir.Attributes(self.functions["main"])
        input_shardings = self._shardings(main.get("arg_attrs", ()), len(inputs))
        output_shardings = self._shardings(main.get("res_attrs", ()), len(outputs))
        return builder.program(
            inputs, outputs, "main", input_shardings=input_shardings,
            output_shardings=output_shardings, input_memory_kinds=input_kinds,
            output_memory_kinds=output_kinds,
            donated_inputs=self._donations(
                self._device_bytes(builder, inputs, input_shardings),
                self._device_bytes(builder, outputs, output_shardings)))

    def _lower_partitioned(self) -> isa.Program:
        """A per-chip program as a program on global values: each argument is split into
        the chip's piece by its parameter sharding, each result assembled by the output
        sharding, so callers pass and get global arrays as for any jax program. A value
        unreduced along some mesh axes (each chip holds a partial sum of it) is passed as
        its partial sums stacked (_main_layout)."""
        builder = ProgramBuilder(self.mesh)
        block = self.function_block("main")
        attrs = mlir.Attributes(self.module.operation)
        in_shardings = attrs.get(partition.PARAMETER_SHARDINGS_ATTR, ())
        inputs, pieces, input_shardings, input_partials = [], [], [], []
        for i, argument in enumerate(block.arguments):
            if mlir.is_token(argument.type):  # made on the chip, not passed (as in `lower`)
                pieces.append(_token(builder))
                continue
            local = _argument_type(i, argument)
            if isinstance(local, mlir.TupleType):
                raise UnsupportedOpError(f"argument {i} of @main has tuple type {local}: "
                                         "jax-trn2 partitions tensor arguments only")
            dim_axes, partial = self._main_layout(in_shardings[i], local.rank)
            stacked = isa.TensorType((1,) * len(partial) + local.shape, local.dtype)
            global_ = self._global_type(stacked, dim_axes)
            inputs.append(builder.new_value(global_, frozenset()))
            self.argument_names[inputs[-1]] = mlir.argument_name(argument) or f"argument {i}"
            input_shardings.append(dim_axes if any(dim_axes) else None)
            input_partials.append(len(partial))
            if not any(dim_axes):
                pieces.append(inputs[-1])
                continue
            split = frozenset(a for axes in dim_axes for a in axes)
            piece = builder.new_value(stacked, split)
            builder.instructions.append(isa.Shard((piece,), (inputs[-1],), dim_axes=dim_axes))
            if partial:  # the chip's own partial sum, without the leading 1s
                stacked_piece, piece = piece, builder.new_value(local, split)
                builder.instructions.append(isa.Reshape((piece,), (stacked_piece,),
                                                        shape=local.shape))
            pieces.append(piece)
        input_kinds = self._host_memory_kinds(
            "arg_attrs", block.arguments,
            [p for p, a in zip(pieces, block.arguments) if not mlir.is_token(a.type)])
        results = self.lower_block(block, pieces, builder)
        outputs, output_shardings, output_partials = [], [], []
        # (XLA leaves no output sharding on a program without results)
        out_texts = hlo_sharding.elements(attrs[partition.OUTPUT_SHARDING_ATTR], len(results)) \
            if results else []
        output_kinds = self._host_memory_kinds("res_attrs", _terminator(block).operands)
        kinds = iter(output_kinds or itertools.repeat(None))
        for value, text, returned in zip(results, out_texts, _terminator(block).operands):
            if mlir.is_token(returned.type):  # jax's callers never see tokens
                continue
            value = self._placed(builder, value, next(kinds))  # each chip its own piece
            local = builder.values[value].type
            dim_axes, partial = self._main_layout(text, local.rank)
            output_shardings.append(dim_axes if any(dim_axes) else None)
            output_partials.append(len(partial))
            if partial:  # each chip's partial sum, stacked along leading dims of its own
                stacked = isa.TensorType((1,) * len(partial) + local.shape, local.dtype)
                chips_value, value = value, builder.new_value(stacked,
                                                              builder.values[value].varying)
                builder.instructions.append(isa.Reshape((value,), (chips_value,),
                                                        shape=stacked.shape))
            global_ = self._global_type(builder.values[value].type, dim_axes)
            outputs.append(builder.new_value(global_, frozenset()))
            builder.instructions.append(isa.Unshard((outputs[-1],), (value,),
                                                    dim_axes=dim_axes))
        return builder.program(inputs, outputs, "main", input_shardings=tuple(input_shardings),
                               output_shardings=tuple(output_shardings),
                               input_memory_kinds=input_kinds,
                               output_memory_kinds=output_kinds,
                               input_partials=tuple(input_partials),
                               output_partials=tuple(output_partials),
                               donated_inputs=self._donations(
                                   self._device_bytes(builder, inputs, input_shardings),
                                   self._device_bytes(builder, outputs, output_shardings)))

    def _host_memory_kinds(self, attrs_key: str, values,
                           held: Sequence[int] = ()) -> tuple[str | None, ...]:
        """Per leaf of main's arguments (`attrs_key` "arg_attrs") or results ("res_attrs"),
        its memory kind where it is in host memory, None where in HBM; () when all are in
        HBM. The values `held` (the arguments' leaves as lowered) are recorded as host
        values, which an annotate_device_placement then moves (lowering.rules.structure)."""
        kinds = partition.memory_kinds(
            values, mlir.Attributes(self.functions["main"]).get(attrs_key, ()))
        kinds = tuple(k if k in isa.HOST_MEMORIES else None for k in kinds)
        self.host_values.update((v, k) for v, k in zip(held, kinds) if k is not None)
        return kinds if any(kinds) else ()

    def _placed(self, builder: ProgramBuilder, value: int, kind: str | None) -> int:
        """A result of main moved into the memory it is given back in (`kind`, a host
        memory kind, or None for HBM) where it is not there yet: jax places a result in host
        memory without an annotate_device_placement for jit's out_shardings and a
        jax.device_put to jax.memory.Space.Host, and XLA offloads it at the end."""
        if (value in self.host_values) == (kind is not None):
            return value
        info = builder.values[value]
        moved = builder.new_value(info.type, info.varying)
        builder.instructions.append(isa.HostTransfer(
            (moved,), (value,), memory_kind=kind or isa.DEVICE_MEMORY))
        if kind is not None:
            self.host_values[moved] = kind
        return moved

    def _donations(self, input_bytes: Sequence[int],
                   output_bytes: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """main's donated arguments as XLA takes them: (input, aliased output), as positions
        among the program's inputs and outputs (tokens are neither, a tuple is its leaves).

        Those jax aliases to a result (tf.aliasing_output), then the buffer donors
        (jax.buffer_donor: the partitioner decides) that XLA's input/output alias pass
        pairs with a result of the same memory kind: largest first, a donor and a result of
        the same bytes per device (`input_bytes`, `output_bytes`). A donor left unpaired is
        not donated (the caller's array stays valid, as under jax.jit)."""
        main = mlir.Attributes(self.functions["main"])
        block = self.function_block("main")
        arguments = list(block.arguments)
        results = list(_terminator(block).operands)
        inputs = _leaf_positions(a.type for a in arguments)
        outputs = _leaf_positions(v.type for v in results)
        attrs = main.get("arg_attrs", ())
        aliased, donors = [], []
        for i, entry in enumerate(attrs):
            if not isinstance(entry, dict) or inputs[i] is None:
                continue
            if "tf.aliasing_output" in entry:
                aliased.append((inputs[i], outputs[int(entry["tf.aliasing_output"])]))
            elif entry.get("jax.buffer_donor"):
                donors.append(inputs[i])
        taken = {output for _, output in aliased}
        input_kinds = [k or "device" for k in partition.memory_kinds(arguments, attrs)]
        output_kinds = [k or "device" for k in
                        partition.memory_kinds(results, main.get("res_attrs", ()))]
        for kind in set(input_kinds[i] for i in donors):
            aliased += _paired_by_size(
                [i for i in donors if input_kinds[i] == kind],
                [o for o in range(len(output_bytes)) if o not in taken and
                 output_kinds[o] == kind], input_bytes, output_bytes)
        return tuple(sorted(aliased))

    def _device_bytes(self, builder: ProgramBuilder, values: Sequence[int],
                      shardings: Sequence[Any]) -> list[int]:
        """Bytes of each value's piece on one device (XLA pads uneven pieces up)."""
        sizes = []
        for value, dim_axes in zip(values, list(shardings) + [None] * len(values)):
            type_ = builder.values[value].type
            shape = type_.shape if dim_axes is None else \
                tuple(-(-n // self._tiles(axes)) for n, axes in zip(type_.shape, dim_axes))
            sizes.append(isa.TensorType(shape, type_.dtype).nbytes)
        return sizes

    def _main_layout(self, text: str, rank: int) -> tuple[tuple[tuple[int, ...], ...],
                                                          tuple[int, ...]]:
        """How a partitioned main's parameter or result of HloSharding `text` and `rank`
        dims lies over the mesh, as the program takes or gives it: the mesh axes each dim is
        split over; and the axes along which each chip's piece is its own, which lead the
        dims as dims of their own, one per axis, split over it: the program's value stacks
        the pieces. Those are the axes it is unreduced along (each chip a partial sum of the
        value), or every axis for a sharding whose devices are not in the mesh's order."""
        tiling = hlo_sharding.parse(text, unreduced=True)
        if tiling is not None and not hlo_sharding.follows_mesh(tiling, self.mesh):
            # devices in another order than the mesh's (a jax mesh of the same devices
            # reordered), which Shard's split in mesh order cannot place: each chip's
            # piece, as its device holds it, stacked as partial sums are
            every = tuple(range(self.mesh.rank))
            return tuple((a,) for a in every) + ((),) * rank, every
        split = ((),) * rank if tiling is None else hlo_sharding.dim_axes(tiling, self.mesh)
        partial = hlo_sharding.unreduced_axes(text, self.mesh)
        return tuple((a,) for a in partial) + split, partial

    def _global_type(self, local: isa.TensorType, dim_axes) -> isa.TensorType:
        return isa.TensorType(tuple(n * self._tiles(axes) for n, axes in
                                    zip(local.shape, dim_axes)), local.dtype)

    def _tiles(self, axes: tuple[int, ...]) -> int:
        return int(np.prod([self.mesh.axis_sizes[a] for a in axes], dtype=np.int64))

    def _shardings(self, attrs: tuple, count: int) -> tuple:
        """dim_axes of each main argument/result from its sdy.sharding (None: replicated,
        as is one that splits no dim: jax's on an array committed to one device)."""
        result = []
        for i in range(count):
            sharding = attrs[i].get("sdy.sharding") if i < len(attrs) and \
                isinstance(attrs[i], dict) else None
            dim_axes = None if sharding is None else partition.sdy_dim_axes(sharding, self.mesh)
            result.append(dim_axes if dim_axes and any(dim_axes) else None)
        return tuple(result)

    def lower_block(self, block, args: Sequence[int], builder: ProgramBuilder,
                    captured: Mapping[Any, int] | None = None) -> list[int]:
        """Lower a block, its arguments bound to `args` and the values it uses from enclosing
        scopes to `captured`."""
        env: dict[Any, int] = dict(captured or {})
        env.update(zip(block.arguments, args))
        ctx = LoweringContext(self, builder, env)
        for operation in block.operations:
            operation = operation.operation
            if operation.name in TERMINATORS:
                return [env[v] for v in operation.operands]
            first_new = len(builder.instructions)
            op = self._read_from_hbm(ctx, self._decode(operation, env))
            results = self._apply_rule(ctx, op, operation)
            if self.partitioned:
                inserted.explain(builder, first_new, op, self.argument_names)
            if len(results) != len(operation.results):
                raise LoweringError(located(
                    f"internal: rule gave {len(results)} results for "
                    f"{len(operation.results)}", op.name, op.loc))
            env.update(zip(operation.results, results))
        raise LoweringError("a block has no terminator")

    def _decode(self, operation, env) -> Op:
        location = mlir.location(operation.location, self.module_name)
        caller = self.callers[-1] if self.callers else None
        loc, via = (location.source, location.via) if location.source or caller is None else \
            (caller.loc, caller.via)
        user_scope = "/".join(s for s in (caller.user_scope if caller else "",
                                          mlir.user_scope(location.name_stack)) if s)
        try:
            return Op(name=operation.name,
                      operands=tuple(env[v] for v in operation.operands),
                      operand_types=tuple(mlir.value_type(v.type) for v in operation.operands),
                      result_types=tuple(mlir.value_type(r.type) for r in operation.results),
                      attrs=mlir.Attributes(operation),
                      regions=tuple(Region(r) for r in operation.regions),
                      loc=loc, scope=location.name_stack, user_scope=user_scope, via=via)
        except mlir.UnsupportedTypeError as e:
            message = str(e)
            if operation.name in SHAPE_OPERANDS:
                message = (f"{e}: the result's shape is operand "
                           + " and ".join(f"{i} ({name})" for i, name in
                                          SHAPE_OPERANDS[operation.name].items())
                           + ", which is not a constant; jax-trn2 runs static shapes only")
            raise UnsupportedOpError(located(message, operation.name, loc,
                                             mlir.source_line(loc))) from None

    def _read_from_hbm(self, ctx: LoweringContext, op: Op) -> Op:
        """`op` reading its operands held in host memory (main's arguments there, which jax
        reads without an annotate_device_placement) from HBM; ops that pass values on
        (MEMORY_NEUTRAL) read them where they are."""
        target = op.attr("call_target_name") if op.name == "stablehlo.custom_call" else None
        if not self.host_values or op.name in MEMORY_NEUTRAL or target in MEMORY_NEUTRAL:
            return op
        return dataclasses.replace(op, operands=tuple(
            map_leaves(v, lambda value: self.in_hbm(ctx, op, value)) for v in op.operands))

    def in_hbm(self, ctx: LoweringContext, op: Op, value: int) -> int:
        """`value` in HBM: a value held in host memory reloaded over the host link for
        `op`, once per program (later readers share the reload, as XLA's)."""
        if value not in self.host_values:
            return value
        key = (id(ctx.builder), value)
        if key not in self.reloads:
            (self.reloads[key],) = ctx.emit(isa.HostTransfer, op, ins=(value,),
                                            out_types=(ctx.type(value),),
                                            memory_kind=isa.DEVICE_MEMORY)
        return self.reloads[key]

    def _apply_rule(self, ctx: LoweringContext, op: Op, operation) -> Sequence[int]:
        rule = RULES.get(op.name)
        if rule is None:
            raise UnsupportedOpError(located(f"{op.name} is not supported by jax-trn2",
                                             op.name, op.loc, mlir.source_line(op.loc)))
        try:
            return rule(ctx, op)
        except LoweringError:
            raise  # already wrapped, at the innermost op
        except Exception as e:
            shapes = ", ".join(str(t) for t in op.operand_types)
            message = (f"{type(e).__name__}: {e}\n  operands: ({shapes}) -> "
                       f"({', '.join(str(t) for t in op.result_types)})\n  op: "
                       f"{_first_line(operation)}")
            cls = UnsupportedOpError if isinstance(e, NotImplementedError) else LoweringError
            raise cls(located(message, op.name, op.loc, mlir.source_line(op.loc))) from e


# A value in the walker's environment: a value id, or (for a tuple) a tuple of values.
Value = Any


def leaves(value: Value) -> tuple[int, ...]:
    """The value ids of a value, a tuple's flattened depth first."""
    return tuple(leaf for v in value for leaf in leaves(v)) if isinstance(value, tuple) \
        else (value,)


def map_leaves(value: Value, fn) -> Value:
    """`value` with each value id replaced by fn(id), keeping its tuple structure."""
    return tuple(map_leaves(v, fn) for v in value) if isinstance(value, tuple) else fn(value)


def values_of(type_: isa.TensorType | mlir.TupleType, new_value) -> Value:
    """A new value of `type_`: new_value(tensor type) for a tensor, a tuple of such for a
    tuple type."""
    if isinstance(type_, mlir.TupleType):
        return tuple(values_of(t, new_value) for t in type_.elements)
    return new_value(type_)


def _free_values(regions) -> list:
    """MLIR values that ops inside `regions` (at any depth) use but that are defined outside
    them, in order of first use."""
    defined, used = set(), []

    def visit(region) -> None:
        for block in region.blocks:
            defined.update(block.arguments)
            for operation in block.operations:
                operation = operation.operation
                used.extend(operation.operands)
                defined.update(operation.results)
                for inner in operation.regions:
                    visit(inner)

    for region in regions:
        visit(region)
    return list(dict.fromkeys(v for v in used if v not in defined))


def _token(builder: ProgramBuilder) -> int:
    """A token made on the chip: a bool scalar, replicated."""
    value = builder.new_value(mlir.TOKEN_TYPE, frozenset())
    builder.instructions.append(isa.Constant((value,), (), value=np.zeros((), bool)))
    return value


def _paired_by_size(donors: list[int], donees: list[int], donor_bytes: Sequence[int],
                    donee_bytes: Sequence[int]) -> list[tuple[int, int]]:
    """XLA's OptimizeInputOutputBufferAlias: donors and results each sorted by size, largest
    first (stably), then matched with two pointers where the sizes are equal."""
    donors = sorted(donors, key=lambda i: -donor_bytes[i])
    donees = sorted(donees, key=lambda o: -donee_bytes[o])
    pairs, d, e = [], 0, 0
    while d < len(donors) and e < len(donees):
        if donor_bytes[donors[d]] > donee_bytes[donees[e]]:
            d += 1
        elif donor_bytes[donors[d]] < donee_bytes[donees[e]]:
            e += 1
        else:
            pairs.append((donors[d], donees[e]))
            d, e = d + 1, e + 1
    return pairs


def _leaf_positions(types) -> list[int | None]:
    """Where each of main's arguments (or results) of these MLIR types starts among the
    program's inputs (or outputs): tokens take no place (None), a tuple one per leaf."""
    positions, count = [], 0
    for t in types:
        if mlir.is_token(t):
            positions.append(None)
            continue
        positions.append(count)
        type_ = mlir.value_type(t)
        count += len(type_.leaves()) if isinstance(type_, mlir.TupleType) else 1
    return positions


def _terminator(block):
    """The op that ends a block (its return)."""
    return list(block.operations)[-1].operation


def _argument_type(index: int, argument) -> isa.TensorType | mlir.TupleType:
    try:
        return mlir.value_type(argument.type)
    except mlir.UnsupportedTypeError as e:
        raise UnsupportedOpError(f"argument {index} of @main: {e}") from None


def _first_line(operation) -> str:
    text = operation.get_asm(large_elements_limit=8)
    line = text.strip().splitlines()[0] if text.strip() else operation.name
    return line if len(line) < 300 else line[:300] + " ..."


def _process_grid(meshes: dict[str, isa.MeshSpec], module_attrs) -> ProcessGrid:
    """The module's mesh and process grid: its (non-empty) sdy.mesh, one replica with a
    partition per device (a jax program); else the mesh ('replica', 'partition') of its
    mhlo.num_replicas x mhlo.num_partitions (an SPMD module; no mesh for one process)."""
    distinct = {m for m in meshes.values() if m.rank}
    if len(distinct) > 1:
        raise LoweringError(f"the module uses several meshes {sorted(map(str, distinct))}; "
                            "jax-trn2 runs one mesh per program")
    partitions = module_attrs["mhlo.num_partitions"] if "mhlo.num_partitions" in module_attrs \
        else 1
    replicas = module_attrs["mhlo.num_replicas"] if "mhlo.num_replicas" in module_attrs else 1
    if partitions < 1 or replicas < 1:
        raise LoweringError(f"mhlo.num_partitions={partitions}, mhlo.num_replicas={replicas}: "
                            "both must be at least 1")
    if distinct:
        mesh = distinct.pop()
        if replicas != 1 or partitions not in (1, mesh.num_devices):
            raise LoweringError(
                f"a module with sdy.mesh {mesh} ({mesh.num_devices} devices) and "
                f"mhlo.num_replicas={replicas}, mhlo.num_partitions={partitions}: jax-trn2 "
                "runs an sdy.mesh as one replica with one partition per device")
        return ProcessGrid(mesh, (), tuple(range(mesh.rank)))
    if partitions * replicas == 1:
        return ProcessGrid(isa.MeshSpec((), ()), (), ())
    return ProcessGrid(isa.MeshSpec(("replica", "partition"), (replicas, partitions)), (0,), (1,))
