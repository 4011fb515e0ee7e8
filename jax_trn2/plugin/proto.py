"""The few protocol-buffer messages the plugin reads and writes, in the wire format.

jaxlib ships no Python classes for XLA's protos; the plugin needs only a device assignment
(read from and written to `DeviceAssignmentProto`) and the wrapper `HloModuleProtoWithConfig`
around an HloModuleProto, so a field reader and writer (lowering.protobuf) are enough. Field
numbers are XLA's (xla/xla_data.proto, xla/service/hlo.proto, xla/xla.proto).
"""

from __future__ import annotations

from typing import Sequence

from lowering.protobuf import field_bytes, field_varint, fields, read_varint, varint, without

# DeviceAssignmentProto
_REPLICA_COUNT, _COMPUTATION_COUNT, _COMPUTATION_DEVICES = 1, 2, 3
_REPLICA_DEVICE_IDS = 1  # ComputationDevice
# HloModuleProtoWithConfig, HloModuleConfigProto, ProgramShapeProto, HloModuleProto
_HLO_MODULE, _CONFIG = 1, 2
_ENTRY_COMPUTATION_LAYOUT = 1
_PARAMETERS, _RESULT, _PARAMETER_NAMES = 1, 2, 3
_HOST_PROGRAM_SHAPE = 4
_SPMD_OUTPUT_SHARDING, _SPMD_PARAMETERS_SHARDINGS = 12, 14
# OpSharding
_SHARDING_TYPE, _TUPLE_SHARDINGS, _TUPLE = 1, 5, 2
# ShapeProto, LayoutProto
_TUPLE_SHAPES, _LAYOUT = 4, 5
_MINOR_TO_MAJOR = 1


def _ints(value: int | bytes) -> list[int]:
    """A repeated integer field's value: one varint, or a packed run of them."""
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        item, pos = read_varint(value, pos)
        out.append(item)
    return out


def read_device_assignment(data: bytes) -> list[list[int]]:
    """A DeviceAssignmentProto as device ids [replica][computation]."""
    replicas = computations = 0
    per_computation: list[list[int]] = []
    for number, value in fields(data):
        if number == _REPLICA_COUNT:
            replicas = value
        elif number == _COMPUTATION_COUNT:
            computations = value
        elif number == _COMPUTATION_DEVICES:
            ids = [i for n, v in fields(value) if n == _REPLICA_DEVICE_IDS for i in _ints(v)]
            per_computation.append(ids)
    if len(per_computation) != computations or any(len(ids) != replicas
                                                   for ids in per_computation):
        raise ValueError(f"a device assignment of {replicas} replicas x {computations} "
                         f"partitions lists {[len(ids) for ids in per_computation]} devices "
                         "per partition")
    return [[per_computation[p][r] for p in range(computations)] for r in range(replicas)]


def write_device_assignment(ids: Sequence[Sequence[int]]) -> bytes:
    """Device ids [replica][computation] as a DeviceAssignmentProto."""
    replicas, computations = len(ids), len(ids[0])
    out = field_varint(_REPLICA_COUNT, replicas) + field_varint(_COMPUTATION_COUNT, computations)
    for p in range(computations):
        out += field_bytes(_COMPUTATION_DEVICES, b"".join(
            field_varint(_REPLICA_DEVICE_IDS, ids[r][p]) for r in range(replicas)))
    return out


def hlo_module_with_config(hlo_module: bytes, parameter_names: Sequence[str],
                           parameter_shardings: Sequence[bytes],
                           output_shardings: Sequence[bytes],
                           parameter_layouts: Sequence[Sequence[int]],
                           output_layouts: Sequence[Sequence[int]]) -> bytes:
    """An HloModuleProtoWithConfig of `hlo_module` (an HloModuleProto) with the shardings
    an SPMD partitioner leaves on a module (`*_shardings`: serialized OpShardings, one per
    parameter and per output), which jaxlib reads as the executable's, and a config whose
    entry computation layout is the module's program shape with `parameter_names` (jaxlib
    checks there is a name per parameter) and the executable's layouts (`*_layouts`: each
    parameter's and output's minor_to_major, which compiled.as_text() shows; those of a
    module whose parameters or outputs are not one each are left as they are)."""
    shape = next((v for n, v in fields(hlo_module) if n == _HOST_PROGRAM_SHAPE), None)
    if shape is None:
        raise ValueError("the HloModuleProto has no host_program_shape")
    parameters = [v for n, v in fields(shape) if n == _PARAMETERS]
    (result,) = [v for n, v in fields(shape) if n == _RESULT]
    outputs = [v for n, v in fields(result) if n == _TUPLE_SHAPES]
    if len(outputs) == len(output_layouts) != 1:  # a tuple of the outputs
        result = without(result, {_TUPLE_SHAPES}) + b"".join(
            field_bytes(_TUPLE_SHAPES, _laid_out(s, layout))
            for s, layout in zip(outputs, output_layouts))
    elif not outputs and len(output_layouts) == 1:
        result = _laid_out(result, output_layouts[0])
    if len(parameters) == len(parameter_layouts):
        parameters = [_laid_out(s, layout) for s, layout in zip(parameters, parameter_layouts)]
    kept = b"".join(field_bytes(_PARAMETERS, s) for s in parameters) + \
        field_bytes(_RESULT, result)
    layout = kept + b"".join(field_bytes(_PARAMETER_NAMES, name.encode())
                             for name in parameter_names)
    config = field_bytes(_ENTRY_COMPUTATION_LAYOUT, layout)
    # XLA gives a program without outputs (an empty tuple) one replicated output sharding,
    # and jaxlib checks for exactly one (GetHloShardings); an empty OpSharding is
    # REPLICATED, its type's default.
    tuple_sharding = field_varint(_SHARDING_TYPE, _TUPLE) + b"".join(
        field_bytes(_TUPLE_SHARDINGS, s) for s in output_shardings) if output_shardings \
        else b""
    # (those the module has, as XLA's partitioner leaves them, are replaced)
    module = without(hlo_module, {_SPMD_OUTPUT_SHARDING, _SPMD_PARAMETERS_SHARDINGS}) + \
        field_bytes(_SPMD_OUTPUT_SHARDING, tuple_sharding) + b"".join(
            field_bytes(_SPMD_PARAMETERS_SHARDINGS, s) for s in parameter_shardings)
    return field_bytes(_HLO_MODULE, module) + field_bytes(_CONFIG, config)


def _laid_out(shape: bytes, minor_to_major: Sequence[int]) -> bytes:
    """An array's ShapeProto with its layout's dim order `minor_to_major` (the layout's
    other fields kept)."""
    layout = next((v for n, v in fields(shape) if n == _LAYOUT), b"")
    order = b"".join(varint(d) for d in minor_to_major)
    layout = without(layout, {_MINOR_TO_MAJOR}) + (field_bytes(_MINOR_TO_MAJOR, order)
                                                   if order else b"")
    return without(shape, {_LAYOUT}) + field_bytes(_LAYOUT, layout)
