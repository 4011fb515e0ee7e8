"""Reading StableHLO through jaxlib's MLIR bindings: modules, types, attributes, locations.

Everything here turns MLIR objects into plain Python values, so that lowering rules never
see an MLIR object.
"""

from __future__ import annotations

import functools
import importlib.util
import linecache
import os
import re
import sysconfig
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
from jax._src.interpreters import mlir as jax_mlir
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import chlo, sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from lowering.errors import unreduced_values
from mesh import dtypes
from mesh.isa import MeshSpec, TensorType

# MLIR element type spelling -> mesh.dtypes name.
ELEMENT_TYPES = {
    "f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16",
    "f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2", "f8E4M3": "float8_e4m3",
    "f8E3M4": "float8_e3m4", "f8E4M3FNUZ": "float8_e4m3fnuz", "f8E5M2FNUZ": "float8_e5m2fnuz",
    "f8E4M3B11FNUZ": "float8_e4m3b11fnuz", "f8E8M0FNU": "float8_e8m0fnu",
    "f6E2M3FN": "float6_e2m3fn", "f6E3M2FN": "float6_e3m2fn", "f4E2M1FN": "float4_e2m1fn",
    "i1": "bool", "i2": "int2", "i4": "int4", "i8": "int8", "i16": "int16", "i32": "int32",
    "i64": "int64", "ui2": "uint2", "ui4": "uint4", "ui8": "uint8", "ui16": "uint16",
    "ui32": "uint32", "ui64": "uint64", "complex<f32>": "complex64", "complex<f64>": "complex128",
}


class UnsupportedTypeError(TypeError):
    pass


def parse(code: str | bytes) -> ir.Module:
    """A module from MLIR text or bytecode, in a context it shares with the modules parsed
    before it (shared_context)."""
    return ir.Module.parse(code, shared_context(len(code)))


def shared_context(size: int) -> ir.Context:
    """An MLIR context (jax's dialects loaded) for a module of about `size` bytes, shared
    with the modules parsed before it: making a context takes about 2.5 ms (and freeing
    it about 1 ms) where parsing a small program's module takes 0.3 ms, on every program
    a process compiles. A context keeps what its modules intern (their constants) until
    it and the last of them are freed, so a new one is made after CONTEXT_MODULES modules
    or CONTEXT_BYTES bytes of their code."""
    global _context, _context_modules, _context_bytes
    with _CONTEXT_LOCK:
        if _context is None or _context_modules >= CONTEXT_MODULES or \
                _context_bytes + size > CONTEXT_BYTES:
            _context, _context_modules, _context_bytes = _MAKE_CONTEXT(), 0, 0
        _context_modules += 1
        _context_bytes += size
        return _context


# jax's maker of a context with its dialects (kept: the executor's lowering replaces jax's
# module attribute with one that calls shared_context, jax_trn2.core.executable)
_MAKE_CONTEXT = jax_mlir.make_ir_context
# How many modules, or bytes of their code, share one context (shared_context).
CONTEXT_MODULES = 64
CONTEXT_BYTES = 16 << 20
_context: ir.Context | None = None
_context_modules = _context_bytes = 0
_CONTEXT_LOCK = threading.Lock()


def parse_module(program: Any) -> ir.Module:
    """A jaxlib `ir.Module` from MLIR text, bytecode (bytes) or an `ir.Module`; a StableHLO
    portable artifact (VHLO, as `jax.export`'s `mlir_module_serialized` is) is upgraded to
    StableHLO, as PJRT's compile does."""
    if isinstance(program, ir.Module):
        module = program
    elif isinstance(program, (str, bytes, bytearray)):
        code = bytes(program) if not isinstance(program, str) else program
        try:
            if is_portable_artifact(code):  # upgraded as it is read, not parsed twice
                return hlo.deserialize_portable_artifact(shared_context(len(code)), code)
            module = parse(code)
        except (ir.MLIRError, ValueError) as e:  # (the upgrade raises a ValueError)
            raise ValueError(f"not a StableHLO module: {e}") from None
    else:
        raise TypeError(f"expected StableHLO as MLIR text, bytecode or an ir.Module, "
                        f"got {type(program).__name__}")
    if any(op.operation.name.startswith("vhlo.") for op in module.body):
        return hlo.deserialize_portable_artifact(module.context,
                                                 jax_mlir.module_to_bytecode(module))
    return module


# MLIR bytecode starts with this magic, then its version (a varint) and its producer; a
# StableHLO portable artifact's producer is StableHLO_v<version> (what jaxlib hands a PJRT
# plugin to compile, as jax.export serializes)
_BYTECODE_MAGIC = b"ML\xefR"
_PORTABLE_PRODUCER = b"StableHLO_v"


def is_portable_artifact(code: str | bytes) -> bool:
    """Whether `code` is a StableHLO portable artifact (VHLO bytecode)."""
    return isinstance(code, bytes) and code.startswith(_BYTECODE_MAGIC) and \
        code.find(_PORTABLE_PRODUCER, len(_BYTECODE_MAGIC), 16) != -1


def tensor_type(t: ir.Type) -> TensorType:
    """A ranked tensor (or a scalar type, as a rank-0 tensor) as a TensorType."""
    if isinstance(t, ir.RankedTensorType) or str(t).startswith("tensor<"):
        rt = ir.RankedTensorType(t)
        if not rt.has_static_shape:
            raise UnsupportedTypeError(f"dynamic shape {t} is not supported by jax-trn2")
        return TensorType(tuple(rt.shape), element_type(rt.element_type))
    return TensorType((), element_type(t))


@dataclass(frozen=True)
class TupleType:
    """A StableHLO tuple type: its element types, tensors or tuples."""

    elements: tuple["TensorType | TupleType", ...]

    def leaves(self) -> tuple[TensorType, ...]:
        """The tensor types of the tuple, flattened depth first."""
        return tuple(leaf for e in self.elements
                     for leaf in (e.leaves() if isinstance(e, TupleType) else (e,)))

    def __str__(self) -> str:
        return f"tuple<{', '.join(map(str, self.elements))}>"


# A !stablehlo.token orders side effects; it carries no data. It is lowered as a bool
# scalar that the ops which order effects pass along (a host callback takes and returns it).
TOKEN_TYPE = TensorType((), "bool")


def is_token(t: ir.Type) -> bool:
    return str(t) == "!stablehlo.token"


# value types by their spelling (a module's values share a few types; reading one through
# the bindings costs more than printing it)
_VALUE_TYPES: dict[str, TensorType | TupleType] = {}
_VALUE_TYPES_KEPT = 4096


def value_type(t: ir.Type) -> TensorType | TupleType:
    """The type of an SSA value: a TensorType (tensors, scalars and tokens) or a
    TupleType."""
    spelling = str(t)
    found = _VALUE_TYPES.get(spelling)
    if found is None:
        if len(_VALUE_TYPES) >= _VALUE_TYPES_KEPT:
            _VALUE_TYPES.clear()
        found = _VALUE_TYPES[spelling] = _read_value_type(t)
    return found


def _read_value_type(t: ir.Type) -> TensorType | TupleType:
    if is_token(t):
        return TOKEN_TYPE
    if str(t).startswith("tuple<"):
        tuple_type = ir.TupleType(t)
        return TupleType(tuple(_read_value_type(tuple_type.get_type(i))
                               for i in range(tuple_type.num_types)))
    return tensor_type(t)


def element_type(t: ir.Type) -> str:
    spelling = str(t)
    try:
        return ELEMENT_TYPES[spelling]
    except KeyError:
        raise UnsupportedTypeError(f"element type {spelling} is not supported by jax-trn2 "
                                   f"(supported: {', '.join(ELEMENT_TYPES)})") from None


# --- attributes ----------------------------------------------------------------------------

@dataclass(frozen=True)
class DotDims:
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]


@dataclass(frozen=True)
class RaggedDotDims:
    """chlo.ragged_dot's dimension numbers."""

    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]
    lhs_ragged: tuple[int, ...]
    rhs_group: tuple[int, ...]


@dataclass(frozen=True)
class GatherDims:
    """stablehlo.gather's dimension numbers."""

    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int


@dataclass(frozen=True)
class ScatterDims:
    """stablehlo.scatter's dimension numbers."""

    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    scatter_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int


@dataclass(frozen=True)
class ConvDims:
    """stablehlo.convolution's dimension numbers in lax.ConvDimensionNumbers order:
    lhs (batch, feature, spatial...), rhs (output feature, input feature, spatial...),
    out (batch, feature, spatial...)."""

    lhs_spec: tuple[int, ...]
    rhs_spec: tuple[int, ...]
    out_spec: tuple[int, ...]


@dataclass(frozen=True)
class DimSharding:
    """One sdy tensor sharding: the mesh axis names each dim is split over (major first),
    and those the value is unreduced along (each device a partial sum of it)."""

    dims: tuple[tuple[str, ...], ...]
    mesh: str
    unreduced: tuple[str, ...] = ()
    text: str = ""

    def split_dims(self) -> tuple[tuple[str, ...], ...]:
        """`dims`, for a caller that has no place for partial sums: an unreduced sharding
        is refused (XLA's partitioner makes the program of any that has one, whose
        parameters and results then carry them: lowering.walker)."""
        if self.unreduced:
            raise unreduced_values(self.text)
        return self.dims


@dataclass(frozen=True)
class MeshAxesGroups:
    """Replica groups named by mesh axes (`#stablehlo.replica_group_mesh_axes`): a group per
    coordinate of the other axes, its members along `axes`, each a mesh axis name and, for a
    sub-axis, its (pre_size, size)."""

    mesh: str | tuple[tuple[str, int], ...]  # an sdy.mesh's name, or inline (axis, size)s
    axes: tuple[tuple[str, tuple[int, int] | None], ...]


def decode_attribute(attr: ir.Attribute) -> Any:
    """A plain Python value for an attribute: ints, floats, strings, tuples, numpy arrays,
    small dataclasses for StableHLO/sdy structured attributes; the text of anything else."""
    for cls, decode in _DECODERS:
        if isinstance(attr, cls) or (hasattr(cls, "isinstance") and cls.isinstance(attr)):
            return decode(cls(attr) if not isinstance(attr, cls) else attr)
    return str(attr)


def _dense_elements(attr: ir.DenseElementsAttr) -> np.ndarray:
    t = tensor_type(attr.type)
    dtype = dtypes.numpy_dtype(t.dtype)
    if attr.is_splat and np.prod(t.shape, dtype=np.int64) > 1:
        # One value broadcast (a read-only view with zero strides): lowering, listing and
        # estimating never allocate the tensor (a full-size model's zeros and ones).
        return np.broadcast_to(_parse_dense_literal(str(attr), dtype, ()), t.shape)
    try:
        return np.array(attr, copy=True).astype(dtype).reshape(t.shape)
    except (ValueError, TypeError, RuntimeError):
        # The bindings read no narrow floats (bf16, fp8): decode the literal of the attribute.
        return _parse_dense_literal(str(attr), dtype, t.shape)


_HEX_BLOB = re.compile(r'^dense<"0x([0-9A-Fa-f]*)">')
_NUMBER = re.compile(r"0x[0-9A-Fa-f]+|[-+]?(?:inf|nan|[0-9][0-9.eE+-]*)|true|false")


def _parse_dense_literal(text: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Decode `dense<...> : tensor<...>` for element types numpy bindings cannot read.

    MLIR prints such constants either as a hex blob of little-endian raw elements, or as
    nested lists of decimal numbers where special values are hex bit patterns.
    """
    size = int(np.prod(shape, dtype=np.int64))
    blob = _HEX_BLOB.match(text)
    if blob:
        raw = np.frombuffer(bytes.fromhex(blob.group(1)), dtype=dtype)
        return np.broadcast_to(raw, (size,)).reshape(shape).copy() if raw.size == 1 \
            else raw.reshape(shape).copy()
    body = text[len("dense<"):text.rindex(">", 0, text.index(" : ") if " : " in text else None)]
    is_complex = np.issubdtype(dtype, np.complexfloating)  # (real, imaginary) pairs
    part = np.dtype(dtype.type(0).real.dtype) if is_complex else dtype
    items = [_literal_item(tok, part) for tok in _NUMBER.findall(body)]
    if is_complex:
        parts = np.array(items, dtype=part)
        items = list(parts[0::2] + 1j * parts[1::2])
    values = np.array(items, dtype=dtype)
    if values.size == 1:
        return np.full(shape, values[0], dtype=dtype)
    return values.reshape(shape)


def _literal_item(token: str, dtype: np.dtype):
    if token.startswith("0x"):
        bits = np.array([int(token, 16)], dtype=f"u{dtype.itemsize}")
        return bits.view(dtype)[0]
    if token in ("true", "false"):
        return token == "true"
    if dtype.name.startswith(("int", "uint")):
        return int(token)  # exactly: a float holds only 53 of a 64-bit integer's bits
    return float(token)


def _dot_dims(attr) -> DotDims:
    return DotDims(tuple(attr.lhs_batching_dimensions), tuple(attr.rhs_batching_dimensions),
                   tuple(attr.lhs_contracting_dimensions), tuple(attr.rhs_contracting_dimensions))


def _ragged_dot_dims(attr) -> RaggedDotDims:
    return RaggedDotDims(tuple(attr.lhs_batching_dimensions), tuple(attr.rhs_batching_dimensions),
                         tuple(attr.lhs_contracting_dimensions),
                         tuple(attr.rhs_contracting_dimensions),
                         tuple(attr.lhs_ragged_dimensions), tuple(attr.rhs_group_dimensions))


def _gather_dims(attr) -> GatherDims:
    return GatherDims(tuple(attr.offset_dims), tuple(attr.collapsed_slice_dims),
                      tuple(attr.operand_batching_dims), tuple(attr.start_indices_batching_dims),
                      tuple(attr.start_index_map), int(attr.index_vector_dim))


def _scatter_dims(attr) -> ScatterDims:
    return ScatterDims(tuple(attr.update_window_dims), tuple(attr.inserted_window_dims),
                       tuple(attr.input_batching_dims),
                       tuple(attr.scatter_indices_batching_dims),
                       tuple(attr.scattered_dims_to_operand_dims), int(attr.index_vector_dim))


def _conv_dims(attr) -> ConvDims:
    return ConvDims(
        (attr.input_batch_dimension, attr.input_feature_dimension,
         *attr.input_spatial_dimensions),
        (attr.kernel_output_feature_dimension, attr.kernel_input_feature_dimension,
         *attr.kernel_spatial_dimensions),
        (attr.output_batch_dimension, attr.output_feature_dimension,
         *attr.output_spatial_dimensions))


def _tensor_sharding(attr) -> DimSharding:
    dims = tuple(tuple(_axis_ref(sdy.AxisRefAttr(a)) for a in sdy.DimensionShardingAttr(d).axes)
                 for d in attr.dimension_shardings)
    unreduced = tuple(_axis_ref(sdy.AxisRefAttr(a)) for a in attr.unreduced_axes)
    return DimSharding(dims, str(attr.mesh_or_ref), unreduced, str(attr))


def _axis_ref(ref) -> str:
    if ref.sub_axis_info is not None:
        raise NotImplementedError(f"sub-axis sharding {ref} is not supported by jax-trn2")
    return ref.name


def _mesh_axes_groups(attr) -> MeshAxesGroups:
    axes = []
    for ref in attr.axes:
        ref = hlo.AxisRefAttr(ref)
        sub = ref.sub_axis_info
        if sub is not None:
            sub = hlo.SubAxisInfoAttr(sub)
        axes.append((ref.name, None if sub is None else (int(sub.pre_size), int(sub.size))))
    mesh = attr.mesh
    if not hlo.MeshAttr.isinstance(mesh):  # a mesh symbol of the module
        try:
            return MeshAxesGroups(ir.FlatSymbolRefAttr(mesh).value, tuple(axes))
        except ValueError as e:
            raise NotImplementedError(f"replica groups over the mesh {mesh} ({attr}): neither "
                                      "a mesh symbol nor an inline #stablehlo.mesh") from e
    mesh = hlo.MeshAttr(mesh)
    if mesh.device_ids is not None and len(mesh.device_ids):
        raise NotImplementedError(f"replica groups over a mesh with explicit device ids "
                                  f"({attr}) are not supported")
    inline = tuple((a.name, int(a.size)) for a in map(hlo.MeshAxisAttr, mesh.axes))
    return MeshAxesGroups(inline, tuple(axes))


_DECODERS: list[tuple[type, Any]] = [
    (ir.BoolAttr, lambda a: bool(a.value)),
    (ir.IntegerAttr, lambda a: int(a.value)),
    (ir.FloatAttr, lambda a: float(a.value)),
    (ir.StringAttr, lambda a: a.value),
    (ir.DenseI64ArrayAttr, lambda a: tuple(int(x) for x in a)),
    (ir.DenseI32ArrayAttr, lambda a: tuple(int(x) for x in a)),
    (ir.DenseBoolArrayAttr, lambda a: tuple(bool(x) for x in a)),
    (ir.DenseElementsAttr, _dense_elements),
    (ir.ArrayAttr, lambda a: tuple(decode_attribute(x) for x in a)),
    (ir.DictAttr, lambda a: {a[i].name: decode_attribute(a[i].attr) for i in range(len(a))}),
    (ir.FlatSymbolRefAttr, lambda a: a.value),
    (ir.TypeAttr, lambda a: str(a.value)),
    (hlo.DotDimensionNumbers, _dot_dims),
    (chlo.RaggedDotDimensionNumbers, _ragged_dot_dims),
    (hlo.GatherDimensionNumbers, _gather_dims),
    (hlo.ScatterDimensionNumbers, _scatter_dims),
    (hlo.ConvDimensionNumbers, _conv_dims),
    (hlo.RngAlgorithmAttr, lambda a: a.value),
    (hlo.RngDistributionAttr, lambda a: a.value),
    (hlo.ComparisonDirectionAttr, lambda a: a.value),
    (hlo.ComparisonTypeAttr, lambda a: a.value),
    (hlo.ChannelHandle, lambda a: (a.handle, a.channel_type)),
    (hlo.ReplicaGroupMeshAxesAttr, _mesh_axes_groups),
    (sdy.TensorShardingPerValueAttr,
     lambda a: tuple(_tensor_sharding(sdy.TensorShardingAttr(s)) for s in a.shardings)),
    (sdy.TensorShardingAttr, _tensor_sharding),
    (sdy.ManualAxesAttr, lambda a: tuple(str(a[i]) for i in range(len(a)))),
]


class Attributes(Mapping):
    """An op's attributes, decoded on first access (constants can be large)."""

    def __init__(self, op: ir.Operation):
        self._op = op
        self._cache: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._cache:
            try:
                attr = self._op.attributes[name]
            except KeyError:
                raise KeyError(f"{self._op.name} has no attribute {name!r}") from None
            except TypeError:  # the bindings cannot return complex dense elements
                self._cache[name] = self._complex_elements(name)
                return self._cache[name]
            self._cache[name] = decode_attribute(attr)
        return self._cache[name]

    def _complex_elements(self, name: str) -> np.ndarray:
        """A dense attribute of complex numbers, read from the op's text."""
        text = self._op.get_asm(large_elements_limit=None)
        match = re.search(rf"{name} = (dense<.*?>) : (tensor<[^>]*>>?)", text) or \
            re.search(r"(dense<.*?>) : (tensor<[^>]*>>?)", text)
        if match is None:
            raise TypeError(f"cannot read attribute {name!r} of {self._op.name}")
        t = tensor_type(ir.Type.parse(match.group(2), self._op.context))
        return _parse_dense_literal(match.group(1), dtypes.numpy_dtype(t.dtype), t.shape)

    def __contains__(self, name: object) -> bool:
        # (Mapping's would decode the attribute, or raise and catch a KeyError: a walk
        # asks every op for attributes few have)
        return name in self._cache or isinstance(name, str) and name in self._op.attributes

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._op.attributes))

    def __len__(self) -> int:
        return len(self._op.attributes)


# --- locations ------------------------------------------------------------------------------

_FILE_LOC = re.compile(r'"([^"]+)":(\d+):(\d+)')
# Not user code: jax, jaxlib, and this project's jax_trn2 package (by its own directory, so
# that user files under a folder named jax_trn2, such as tests/jax_trn2, still count).
_INTERNAL = ("/jax/", "/jaxlib/", "site-packages/jax", "<frozen",
             str(Path(__file__).resolve().parents[1] / "jax_trn2") + os.sep)
# Libraries the user's code calls (a flax Dense makes its matmul in flax/linen/linear.py):
# installed packages, Python's standard library, and the neural-network libraries wherever
# they are installed from (an editable install of flax is not under site-packages).
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/")
_LIBRARY_PACKAGES = ("flax", "optax", "equinox")


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")}
    for name in _LIBRARY_PACKAGES:
        spec = importlib.util.find_spec(name)  # finds the package without importing it
        if spec is not None and spec.submodule_search_locations:
            dirs.update(spec.submodule_search_locations)
    return tuple(os.path.join(d, "") for d in dirs)


def _is_library(path: str) -> bool:
    return any(mark in path for mark in _LIBRARY_MARKS) or path.startswith(_library_dirs())


# The file name MLIR's parser gives positions in text it parsed from a string: the ops of a
# module without debug locations (jax's `as_text()`) sit at their lines of the module text.
_PARSED_TEXT = "-"
MODULE_TEXT = "<module>"  # the name of such text when the caller has no file name for it


class Location(NamedTuple):
    """Where an op comes from, read from its MLIR location.

    `source`: the innermost frame of the user's own code, `file:line:col` (a library's when
    no user frame made the op, '' when the op has no source position); `via`: the library
    frame inside that call which made the op (`.../flax/linen/linear.py:287:8`), or '';
    `name_stack`: jax's name stack (`jit(step)/jvp(Model)/block0/attn/q/dot_general`)."""

    source: str
    via: str
    name_stack: str


def scope_name(loc: ir.Location) -> str:
    """The jax name stack an op's location starts with (`jit(f)/transpose(jvp(dot_general))`),
    or ''."""
    return location(loc).name_stack


def location(loc: ir.Location, module_name: str = MODULE_TEXT) -> Location:
    """The user's source line of an op, the library line it went through, and its name
    stack, from its MLIR location (printed once: a large module's locations are long, and
    many ops share one).

    The bindings expose no accessors for file and call-site locations, so the location's
    printed form is searched, innermost frame first (as jax prints them), for the first
    position outside jax's own code and outside libraries. An op of a module without debug
    locations is at its line of the module text: `module_name:line:col`.
    """
    return _location(str(loc), module_name)


@functools.lru_cache(maxsize=4096)
def _location(text: str, module_name: str) -> Location:
    user = via = ""
    for path, line, col in _FILE_LOC.findall(text):
        if path == _PARSED_TEXT:
            user = f"{module_name}:{line}:{col}"
            break
        if any(mark in path for mark in _INTERNAL):
            continue
        if not _is_library(path):
            user = f"{path}:{line}:{col}"
            break
        via = via or f"{path}:{line}:{col}"
    name_stack = _SCOPE.match(text)
    return Location(user or via, via if user else "", name_stack.group(1) if name_stack else "")


_SCOPE = re.compile(r'^loc\("([^"]+)"(?!:)')
# Names jax itself puts on the name stack: its control flow's (lax.cond, lax.while_loop and
# scan) and jax.checkpoint's. (`jit(f)`, a jitted function's boundary, is not a scope either.)
_JAX_SCOPES = re.compile(r"while|body|body_pred|cond|branch_\d+_fun|checkpoint|"
                         r"rematted_computation")
_WRAPPED = re.compile(r"(\w+)\((.*)\)")  # a transform of a name: `transpose(jvp(block0))`


@functools.lru_cache(maxsize=4096)  # (ops share name stacks: a block's often all of it)
def user_scope(name_stack: str) -> str:
    """The user's name scopes in a jax name stack, outermost first: the Flax module path
    `Model/block0/attn/q` (or jax.named_scope names) of
    `jit(step)/transpose(jvp(Model))/block0/attn/q/dot_general`, without the jitted
    function, the transforms, jax's own scopes and the primitive; '' when there are none.
    An op XLA made of several (`.../mul;jit(step)/.../broadcast_in_dim`) is in the scopes
    of the first."""
    names: list[str] = []
    for name in name_stack.split(";")[0].split("/")[:-1]:  # the last one is the primitive
        while (wrapped := _WRAPPED.fullmatch(name)) and wrapped.group(1) != "jit":
            name = wrapped.group(2)
        if not name or name.startswith("jit(") or _JAX_SCOPES.fullmatch(name):
            continue
        # the backward pass of a rematerialized scope re-enters it (`transpose(jvp(Model))/
        # jvp(Model)/...`): one scope, not a child of itself
        if not names or names[-1] != name:
            names.append(name)
    return "/".join(names)


def argument_name(argument) -> str:
    """The name jax gave a function argument (its location: `params['w1']`), or ''."""
    return scope_name(argument.location)


def source_line(location: str) -> str:
    """The text of the source line `file:line:col` names, or ''."""
    if not location:
        return ""
    path, line, _ = location.rsplit(":", 2)
    return linecache.getline(path, int(line)).strip()


def mesh_spec(mesh_op: ir.Operation) -> MeshSpec:
    """The MeshSpec of an `sdy.mesh` op (axis names and sizes; its devices in row-major
    order are mesh_device_ids')."""
    attr = sdy.MeshAttr(mesh_op.attributes["mesh"])
    axes = [sdy.MeshAxisAttr(a) for a in attr.axes]
    return MeshSpec(tuple(a.name for a in axes), tuple(int(a.size) for a in axes))


def mesh_device_ids(mesh_op: ir.Operation) -> list[int] | None:
    """The device ids of an `sdy.mesh` op in row-major mesh order when it lists them in
    another order than 0, 1, ... (jax's program over a mesh of the same devices in another
    order, as its device_put between two such meshes makes); None otherwise."""
    device_ids = [int(d) for d in sdy.MeshAttr(mesh_op.attributes["mesh"]).device_ids]
    return device_ids if device_ids and device_ids != list(range(len(device_ids))) else None
