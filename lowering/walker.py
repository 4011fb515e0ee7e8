"""The StableHLO walker: value environment, op decoding and dispatch to rules.

Rules see an `Op` (operand value ids, TensorTypes, lazily decoded attributes, opaque region
handles, the user's source location) and a `LoweringContext` to emit instructions with; they
never see an MLIR object. A missing rule is a hard error naming the op and its source line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxlib.mlir import ir

from lowering import mlir
from lowering.errors import LoweringError, UnsupportedOpError, located
from lowering.registry import RULES
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
    def arg_types(self) -> tuple[isa.TensorType, ...]:
        return tuple(mlir.tensor_type(a.type) for a in self.block.arguments)


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

    @property
    def short_name(self) -> str:
        return self.name.split(".", 1)[-1]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs[name] if name in self.attrs else default


class ProgramBuilder:
    """Collects instructions and value infos of one program."""

    def __init__(self, mesh: isa.MeshSpec, first_id: int = 0):
        self.mesh = mesh
        self.instructions: list[isa.Instruction] = []
        self.values: dict[int, isa.ValueInfo] = {}
        self._next = first_id

    def new_value(self, type_: isa.TensorType, varying: frozenset[int]) -> int:
        vid = self._next
        self._next += 1
        self.values[vid] = isa.ValueInfo(type_, frozenset(varying))
        return vid

    def program(self, inputs: Sequence[int], outputs: Sequence[int], name: str,
                **shardings) -> isa.Program:
        return isa.Program(self.mesh, tuple(self.instructions), tuple(inputs), tuple(outputs),
                           dict(self.values), name, **shardings)


class LoweringContext:
    """What a rule may do: look at values, emit instructions, lower the op's regions."""

    def __init__(self, walker: "Walker", builder: ProgramBuilder):
        self.walker = walker
        self.builder = builder

    @property
    def mesh(self) -> isa.MeshSpec:
        return self.builder.mesh

    def type(self, value: int) -> isa.TensorType:
        return self.builder.values[value].type

    def varying(self, value: int) -> frozenset[int]:
        return self.builder.values[value].varying

    def emit(self, cls: type, op: Op, /, ins: Sequence[int] | None = None,
             out_types: Sequence[isa.TensorType] | None = None,
             varying: frozenset[int] | None = None, **params) -> tuple[int, ...]:
        """Emit one instruction; outputs vary along the union of the inputs' axes unless
        `varying` says otherwise."""
        ins = tuple(op.operands if ins is None else ins)
        out_types = tuple(op.result_types if out_types is None else out_types)
        if varying is None:
            varying = frozenset().union(*(self.varying(v) for v in ins))
        outs = tuple(self.builder.new_value(t, varying) for t in out_types)
        self.builder.instructions.append(cls(outs, ins, loc=op.loc, **params))
        return outs

    def inline_region(self, region: Region, args: Sequence[int]) -> list[int]:
        """Lower a region's block in place, its arguments bound to `args`."""
        return self.walker.lower_block(region.block, args, self.builder)

    def call(self, function: str, args: Sequence[int]) -> list[int]:
        return self.walker.lower_block(self.walker.function_block(function), args, self.builder)

    def scalar_program(self, region: Region, name: str) -> isa.Program:
        """A region as a separate program with no mesh dims (a reducer or comparator body)."""
        builder = ProgramBuilder(isa.MeshSpec((), ()))
        inputs = [builder.new_value(t, frozenset()) for t in region.arg_types]
        outputs = self.walker.lower_block(region.block, inputs, builder)
        return builder.program(inputs, outputs, name)


class Walker:
    """Lowers one StableHLO module to a Trn2 `Program`."""

    def __init__(self, module: ir.Module):
        self.module = module
        self.functions: dict[str, Any] = {}
        meshes: dict[str, isa.MeshSpec] = {}
        for op in module.body.operations:
            op = op.operation  # the generic op (a FuncOp view's .name is its symbol)
            attrs = mlir.Attributes(op)
            if op.name == "func.func":
                self.functions[attrs["sym_name"]] = op
            elif op.name == "sdy.mesh":
                meshes[attrs["sym_name"]] = mlir.mesh_spec(op)
        if "main" not in self.functions:
            raise LoweringError("the module has no public function 'main'")
        self.mesh = _the_mesh(meshes, mlir.Attributes(module.operation))

    def function_block(self, name: str):
        try:
            return self.functions[name].regions[0].blocks[0]
        except KeyError:
            raise LoweringError(f"func.call of unknown function @{name}") from None

    def lower(self) -> isa.Program:
        builder = ProgramBuilder(self.mesh)
        block = self.function_block("main")
        inputs = [builder.new_value(mlir.tensor_type(a.type), frozenset())
                  for a in block.arguments]
        outputs = self.lower_block(block, inputs, builder)
        main = mlir.Attributes(self.functions["main"])
        return builder.program(
            inputs, outputs, "main",
            input_shardings=self._shardings(main.get("arg_attrs", ()), len(inputs)),
            output_shardings=self._shardings(main.get("res_attrs", ()), len(outputs)))

    def _shardings(self, attrs: tuple, count: int) -> tuple:
        """dim_axes of each main argument/result from its sdy.sharding (None: replicated)."""
        result = []
        for i in range(count):
            sharding = attrs[i].get("sdy.sharding") if i < len(attrs) and \
                isinstance(attrs[i], dict) else None
            result.append(None if sharding is None else
                          tuple(tuple(self.mesh.axis_index(a) for a in dim)
                                for dim in sharding.dims))
        return tuple(result)

    def lower_block(self, block, args: Sequence[int], builder: ProgramBuilder) -> list[int]:
        env: dict[Any, int] = dict(zip(block.arguments, args))
        ctx = LoweringContext(self, builder)
        for operation in block.operations:
            operation = operation.operation
            if operation.name in TERMINATORS:
                return [env[v] for v in operation.operands]
            op = self._decode(operation, env)
            results = self._apply_rule(ctx, op, operation)
            if len(results) != len(operation.results):
                raise LoweringError(located(
                    f"internal: rule gave {len(results)} results for "
                    f"{len(operation.results)}", op.name, op.loc))
            env.update(zip(operation.results, results))
        raise LoweringError("a block has no terminator")

    def _decode(self, operation, env) -> Op:
        loc = mlir.source_location(operation.location)
        try:
            return Op(name=operation.name,
                      operands=tuple(env[v] for v in operation.operands),
                      operand_types=tuple(mlir.tensor_type(v.type) for v in operation.operands),
                      result_types=tuple(mlir.tensor_type(r.type) for r in operation.results),
                      attrs=mlir.Attributes(operation),
                      regions=tuple(Region(r) for r in operation.regions),
                      loc=loc)
        except mlir.UnsupportedTypeError as e:
            raise UnsupportedOpError(located(str(e), operation.name, loc,
                                             mlir.source_line(loc))) from None

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


def _first_line(operation) -> str:
    text = operation.get_asm(large_elements_limit=8)
    line = text.strip().splitlines()[0] if text.strip() else operation.name
    return line if len(line) < 300 else line[:300] + " ..."


def _the_mesh(meshes: dict[str, isa.MeshSpec], module_attrs) -> isa.MeshSpec:
    """The module's mesh: its (non-empty) sdy.mesh, else one axis over its partitions."""
    distinct = {m for m in meshes.values() if m.rank}
    if len(distinct) > 1:
        raise LoweringError(f"the module uses several meshes {sorted(map(str, distinct))}; "
                            "jax-trn2 runs one mesh per program")
    if distinct:
        return distinct.pop()
    partitions = module_attrs["mhlo.num_partitions"] if "mhlo.num_partitions" in module_attrs \
        else 1
    replicas = module_attrs["mhlo.num_replicas"] if "mhlo.num_replicas" in module_attrs else 1
    if partitions * replicas > 1:
        raise UnsupportedOpError(
            f"a module with mhlo.num_partitions={partitions}, mhlo.num_replicas={replicas} "
            "and no sdy.mesh is not supported yet: write the program with jax.shard_map")
    return isa.MeshSpec((), ())
