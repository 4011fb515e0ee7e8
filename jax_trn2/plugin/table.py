"""The PJRT_Api table: one function per slot, each decoding its args struct, calling the
plugin's client, buffer or executable, and writing the out-fields; the events' slots and
the getters jaxlib calls for every buffer of every call are the C shim's (FAST_SLOTS), and
the shim calls the destroy slots (GUARDED_SLOTS).

Slots left NULL are ones jaxlib checks for or never calls here; `UNIMPLEMENTED` slots are
ones it calls unconditionally and accepts an error from. `retire` points every slot at the
C shim's no-op when Python finalises: jaxlib's destructors still call Client_Destroy and
Buffer_Destroy after ctypes has freed its callbacks.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
from typing import Any

import jax

from jax_trn2.plugin import abi, memory_layouts
from jax_trn2.plugin.abi import c
from jax_trn2.plugin.errors import Errors, PjrtError
from jax_trn2.plugin.handles import Buffer, Device, Handles, Memory, MemoryVtable, Record
from mesh.memory_layout import in_memory, row_major

HANDLES = Handles()
ERRORS = Errors(HANDLES)
MEMORY_VTABLE = MemoryVtable()
_PLUGIN = abi.Owned()  # the plugin's own C values (attributes)
_SLOTS: dict[str, Any] = {}  # slot name -> its ctypes function (kept alive)
# the Python slots of PJRT's extensions the table lists, likewise, by extension
_EXTENSION_SLOTS: dict[str, dict[str, Any]] = {"Layouts": {}, "Shardings": {}}
_EXTENSIONS: list[Any] = []  # the extensions the table lists (kept alive)
# Slots the C shim implements (_shim.c), reading the Records of buffers, memories and
# executables.
FAST_SLOTS = ("Event_Destroy", "Event_IsReady", "Event_Error", "Event_Await",
              "Event_OnReady", "Buffer_ReadyEvent", "Buffer_Device", "Buffer_Memory",
              "Buffer_IsDeleted", "Memory_Kind", "Executable_NumReplicas",
              "Executable_NumPartitions", "Executable_NumOutputs")
# Python slots the shim calls with Python's pending exception set aside and the default
# floating-point environment (_shim.c): the destroy slots, which C++ destructors call when
# Python frees a jax object, possibly while an exception is on its way out (and jaxlib's
# Error_Destroy of NULL errors, which the shim answers itself), and which jaxlib also calls
# on its own threads (the shim defers those to a thread Python knows); the compiles, which
# jaxlib runs on threads that flush subnormal numbers to zero.
GUARDED_SLOTS = ("Buffer_Destroy", "Executable_Destroy", "LoadedExecutable_Destroy",
                 "Client_Destroy", "Error_Destroy", "Client_Compile",
                 "Executable_DeserializeAndLoad")
_READY = 0  # the one event, ready (the shim's trn2_ready_event), set by build()


def slot(function):
    _SLOTS[f"PJRT_{function.__name__}"] = ERRORS.slot(function)
    return function


def extension_slot(function):
    """A slot of one of PJRT's extensions, named as its args struct: `Layouts_...` of the
    layouts extension (plugin.memory_layouts), `Shardings_...` of the shardings one."""
    extension = function.__name__.split("_")[0]
    _EXTENSION_SLOTS[extension][f"PJRT_{function.__name__}"] = ERRORS.slot(function)
    return function


def _unimplemented(name: str, why: str) -> None:
    def function(args):
        raise NotImplementedError(f"{name} is not implemented by the trn2 plugin: {why}")
    function.__name__ = name
    slot(function)


def _get(pointer: int, kind):
    return HANDLES.get(pointer, kind)


# The modules imported when first used (not while jax loads the plugin), then remembered:
# jaxlib calls slots that look them up several times a run.

@functools.cache
def _client():
    from jax_trn2.plugin.client import Client
    return Client


@functools.cache
def _executable_types():
    from jax_trn2.plugin import executable
    return executable


# --- errors -------------------------------------------------------------------------------

@slot
def Error_Destroy(args):
    ERRORS.destroy(args.error)


@slot
def Error_Message(args):
    error = ERRORS.get(args.error)
    args.message, args.message_size = error.owned.string(error.message)


@slot
def Error_GetCode(args):
    args.code = ERRORS.get(args.error).code


@slot
def Error_ForEachPayload(args):
    """No payloads (jaxlib calls this for every error: it must not fail)."""


# --- plugin -------------------------------------------------------------------------------

@slot
def Plugin_Initialize(args):
    pass


@slot
def Plugin_Attributes(args):
    from jax_trn2.plugin.client import attributes
    args.attributes, args.num_attributes = _PLUGIN.named_values(attributes())


# --- client -------------------------------------------------------------------------------

@slot
def Client_Create(args):
    from jax_trn2.core.options import client_options
    from jax_trn2.plugin.client import Client, register_device_mesh
    given = abi.read_named_values(args.create_options, args.num_options)
    client = Client(client_options(given), HANDLES, MEMORY_VTABLE.address)
    register_device_mesh(client.options.topology)  # for jax.make_mesh of its devices
    args.client = HANDLES.add(client)


@slot
def Client_Destroy(args):
    HANDLES.remove(args.client or 0)


def _the_client(pointer: int):
    return _get(pointer, _client())


@slot
def Client_PlatformName(args):
    from jax_trn2.core.platform import PLATFORM_NAME
    client = _the_client(args.client)
    args.platform_name, args.platform_name_size = client.owned.string(PLATFORM_NAME)


@slot
def Client_ProcessIndex(args):
    args.process_index = _the_client(args.client).options.process_index


@slot
def Client_PlatformVersion(args):
    client = _the_client(args.client)
    args.platform_version, args.platform_version_size = \
        client.owned.string(client.platform_version)


def _device_pointers(owner: Any, devices) -> tuple[int, int]:
    return owner.owned.array(ctypes.c_void_p, [HANDLES.pointer(d) for d in devices])


@slot
def Client_Devices(args):
    client = _the_client(args.client)
    args.devices, args.num_devices = _device_pointers(client, client.devices)


@slot
def Client_AddressableDevices(args):
    client = _the_client(args.client)
    args.addressable_devices, args.num_addressable_devices = \
        _device_pointers(client, client.addressable_devices)


@slot
def Client_LookupDevice(args):
    args.device = HANDLES.pointer(_the_client(args.client).device(args.id))


@slot
def Client_LookupAddressableDevice(args):
    args.addressable_device = HANDLES.pointer(
        _the_client(args.client).device(args.local_hardware_id))


@slot
def Client_AddressableMemories(args):
    client = _the_client(args.client)
    args.addressable_memories, args.num_addressable_memories = client.owned.array(
        ctypes.c_void_p, [HANDLES.pointer(m) for m in client.memories
                          if m.device.addressable])


@slot
def Client_Compile(args):
    client = _the_client(args.client)
    program = c.PJRT_Program.from_address(args.program)
    program_format = ctypes.string_at(program.format, program.format_size).decode()
    if program_format != "mlir":
        raise ValueError(f"the trn2 plugin compiles StableHLO (program format 'mlir'), got "
                         f"{program_format!r}")
    executable = _executable_types().Executable(
        client, ctypes.string_at(program.code, program.code_size),
        ctypes.string_at(args.compile_options, args.compile_options_size))
    args.executable = _add_executable(executable)


@slot
def Client_DefaultDeviceAssignment(args):
    count = args.num_replicas * args.num_partitions
    ids = (ctypes.c_int * count).from_address(args.default_assignment)
    ids[:] = _the_client(args.client).default_assignment(count)


@slot
def Client_BufferFromHostBuffer(args):
    client = _the_client(args.client)
    if args.memory:
        memory = _get(args.memory, Memory)
    else:
        memory = _get(args.device, Device).memories[0]
    dims = list((ctypes.c_int64 * args.num_dims).from_address(args.dims)) if args.num_dims \
        else []
    strides = list((ctypes.c_int64 * args.num_byte_strides).from_address(args.byte_strides)) \
        if args.byte_strides and args.num_byte_strides else None
    buffer = client.buffer_from_host(args.data or 0, abi.dtype_of(args.type), dims, strides,
                                     memory)
    if args.device_layout:  # the bytes' order on the device (the host's is `strides`)
        buffer.memory_layout = memory_layouts.read(args.device_layout, len(dims))
    args.buffer = _new_buffer(buffer)
    args.done_with_host_buffer = _READY  # copied: the host memory is free


@slot
def Client_UpdateGlobalProcessInfo(args):
    """Under jax.distributed, jaxlib's watcher thread reports every process's state (its
    coordination service's): kept, for errors that name a process that is gone."""
    client = _the_client(args.client)
    infos = (c.PJRT_ProcessInfo * args.num_process_infos).from_address(args.process_infos) \
        if args.num_process_infos else []
    client.process_states = {info.task_id: info.state for info in infos}


_unimplemented("Client_TopologyDescription",
               "the simulated machine's topology is jax_trn2's (mesh.machine)")


# --- devices and their descriptions (one object each) -------------------------------------

@slot
def Device_GetDescription(args):
    args.device_description = HANDLES.pointer(_get(args.device, Device))


@slot
def Device_IsAddressable(args):
    args.is_addressable = _get(args.device, Device).addressable


@slot
def Device_LocalHardwareId(args):
    args.local_hardware_id = _get(args.device, Device).id


@slot
def Device_AddressableMemories(args):
    device = _get(args.device, Device)
    args.memories, args.num_memories = device.owned.array(
        ctypes.c_void_p, [HANDLES.pointer(m) for m in device.memories])


@slot
def Device_DefaultMemory(args):
    args.memory = HANDLES.pointer(_get(args.device, Device).memories[0])


@slot
def Device_MemoryStats(args):
    """HBM of the chip: its capacity from the chip spec; in use, the buffers on it now."""
    device = _get(args.device, Device)
    args.bytes_in_use = device.bytes_in_use
    args.peak_bytes_in_use, args.peak_bytes_in_use_is_set = device.peak_bytes_in_use, True
    args.bytes_limit, args.bytes_limit_is_set = device.hbm_bytes, True
    for field in ("num_allocs", "largest_alloc_size", "bytes_reserved", "peak_bytes_reserved",
                  "bytes_reservable_limit", "largest_free_block_bytes", "pool_bytes",
                  "peak_pool_bytes"):
        setattr(args, f"{field}_is_set", False)
    if abi.has_field(args, "peak_allocated_bytes_is_set"):
        args.peak_allocated_bytes_is_set = False


@slot
def DeviceDescription_Id(args):
    args.id = _get(args.device_description, Device).id


@slot
def DeviceDescription_ProcessIndex(args):
    args.process_index = _get(args.device_description, Device).process_index


@slot
def DeviceDescription_Attributes(args):
    device = _get(args.device_description, Device)
    args.attributes, args.num_attributes = device.owned.named_values(device.attributes())


@slot
def DeviceDescription_Kind(args):
    device = _get(args.device_description, Device)
    args.device_kind, args.device_kind_size = device.owned.string(device.kind)


@slot
def DeviceDescription_DebugString(args):
    device = _get(args.device_description, Device)
    args.debug_string, args.debug_string_size = device.owned.string(device.to_string())


@slot
def DeviceDescription_ToString(args):
    device = _get(args.device_description, Device)
    args.to_string, args.to_string_size = device.owned.string(device.to_string())


# --- memories -----------------------------------------------------------------------------

@slot
def Memory_Id(args):
    args.id = _get(args.memory, Memory).id


@slot
def Memory_Kind_Id(args):
    args.kind_id = _get(args.memory, Memory).kind_id


@slot
def Memory_DebugString(args):
    memory = _get(args.memory, Memory)
    args.debug_string, args.debug_string_size = memory.owned.string(memory.description())


@slot
def Memory_ToString(args):
    memory = _get(args.memory, Memory)
    args.to_string, args.to_string_size = memory.owned.string(memory.description())


@slot
def Memory_AddressableByDevices(args):
    memory = _get(args.memory, Memory)
    args.devices, args.num_devices = memory.owned.array(ctypes.c_void_p,
                                                        [HANDLES.pointer(memory.device)])


# --- buffers ------------------------------------------------------------------------------

@slot
def Buffer_Destroy(args):
    if args.buffer:
        HANDLES.get(args.buffer, Buffer).delete()
        HANDLES.remove(args.buffer)


@slot
def Buffer_ElementType(args):
    buffer = _get(args.buffer, Buffer)
    args.type = abi.buffer_type(buffer.dtype)


@slot
def Buffer_Dimensions(args):
    buffer = _get(args.buffer, Buffer)
    args.dims, args.num_dims = buffer.owned.array(ctypes.c_int64, buffer.shape)


@slot
def Buffer_UnpaddedDimensions(args):
    buffer = _get(args.buffer, Buffer)
    args.unpadded_dims, args.num_dims = buffer.owned.array(ctypes.c_int64, buffer.shape)


@slot
def Buffer_DynamicDimensionIndices(args):
    _get(args.buffer, Buffer)
    args.dynamic_dim_indices, args.num_dynamic_dims = 0, 0


@slot
def Buffer_OnDeviceSizeInBytes(args):
    args.on_device_size_in_bytes = _get(args.buffer, Buffer).nbytes


@slot
def Buffer_Delete(args):
    _get(args.buffer, Buffer).delete()


@slot
def Buffer_IsOnCpu(args):
    _get(args.buffer, Buffer)
    args.is_on_cpu = False  # a chip's HBM, as jax should see it (no zero-copy views)


@slot
def Buffer_UnsafePointer(args):
    """The address of the host memory holding the buffer's bytes, in its layout (jax.Array's
    unsafe_buffer_pointer). jaxlib calls this slot without checking it is set: left NULL,
    it crashed the process."""
    args.buffer_pointer = _get(args.buffer, Buffer).in_memory().ctypes.data


@slot
def Buffer_ToHostBuffer(args):
    """Copy to the caller's host memory, dense, in the order of the caller's host layout
    (PJRT: the buffer's own when none is given); with no destination, say how many bytes
    it needs."""
    buffer = _get(args.src, Buffer)
    data = buffer.data()
    if not args.dst:
        args.dst_size = data.nbytes
        return
    if args.dst_size < data.nbytes:
        raise ValueError(f"a host buffer of {args.dst_size} bytes cannot hold the "
                         f"{data.nbytes} bytes of {buffer}")
    order = memory_layouts.read(args.host_layout, data.ndim) if args.host_layout else \
        buffer.memory_layout
    # A piece that is a strided view of a larger result (or laid out otherwise) is copied
    # into a temporary here: it must stay bound until memmove has read it (freed, its
    # first bytes are malloc's free-list links)
    dense = in_memory(data, order)
    ctypes.memmove(args.dst, dense.ctypes.data, data.nbytes)
    args.event = _READY


def _new_buffer(buffer: Buffer) -> int:
    """The pointer of a new buffer, its Record telling the shim its device, memory and
    memory layout."""
    buffer.record.device = HANDLES.pointer(buffer.device)
    buffer.record.memory = HANDLES.pointer(buffer.memory)
    buffer.record.memory_layout = memory_layouts.pointer(buffer.memory_layout)
    return HANDLES.add(buffer, buffer.record)


def _copy(buffer: Buffer, memory: Memory) -> int:
    """A copy in `memory`, laid out as the original (PJRT keeps a buffer's layout)."""
    return _new_buffer(Buffer(buffer.data(), memory.device, memory,
                              memory_layout=buffer.memory_layout))


@slot
def Buffer_CopyToDevice(args):
    args.dst_buffer = _copy(_get(args.buffer, Buffer),
                            _get(args.dst_device, Device).memories[0])


@slot
def Buffer_CopyToMemory(args):
    args.dst_buffer = _copy(_get(args.buffer, Buffer), _get(args.dst_memory, Memory))


# --- executables: a LoadedExecutable and the Executable views of it are one object -------

def _executable(pointer: int):
    return _get(pointer, _executable_types().Executable)


@slot
def Executable_Destroy(args):
    HANDLES.remove(args.executable or 0)


@slot
def LoadedExecutable_Destroy(args):
    HANDLES.remove(args.executable or 0)


@slot
def LoadedExecutable_GetExecutable(args):
    executable = _executable(args.loaded_executable)
    args.executable = _add_executable(_executable_types().View(executable), executable)


def _of(pointer: int):
    """The executable behind a PJRT_Executable (a View) or PJRT_LoadedExecutable."""
    obj = HANDLES.get(pointer, object)
    module = _executable_types()
    return obj.executable if isinstance(obj, module.View) else \
        HANDLES.get(pointer, module.Executable)


@slot
def Executable_Name(args):
    executable = _of(args.executable)
    args.executable_name, args.executable_name_size = executable.owned.string(executable.name)


def _add_executable(obj: Any, executable: Any = None) -> int:
    """The pointer of `obj`, a loaded executable or a View of `executable`, whose Record
    holds the counts the shim's Executable_NumReplicas/NumPartitions/NumOutputs answer."""
    executable = obj if executable is None else executable
    record = Record(num_replicas=executable.num_replicas,
                    num_partitions=executable.num_partitions,
                    num_outputs=executable.num_outputs)
    return HANDLES.add(obj, record)


@slot
def Executable_SizeOfGeneratedCodeInBytes(args):
    _of(args.executable)
    args.size_in_bytes = 0  # instruction streams are not modelled


@slot
def Executable_GetCostAnalysis(args):
    executable = _of(args.executable)
    args.properties, args.num_properties = executable.owned.named_values(
        executable.cost_analysis())


@slot
def Executable_GetCompiledMemoryStats(args):
    stats = _of(args.executable).memory_stats()
    for field in ("generated_code_size_in_bytes", "argument_size_in_bytes",
                  "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                  "peak_memory_in_bytes", "host_generated_code_size_in_bytes",
                  "host_argument_size_in_bytes", "host_output_size_in_bytes",
                  "host_alias_size_in_bytes", "host_temp_size_in_bytes"):
        setattr(args, field, getattr(stats, field))
    if abi.has_field(args, "total_size_in_bytes"):
        args.total_size_in_bytes = stats.peak_memory_in_bytes


@slot
def Executable_OutputMemoryKinds(args):
    executable = _of(args.executable)
    kinds = executable.out_memory_kinds
    addresses = [executable.owned.string(k)[0] for k in kinds]
    args.num_outputs = len(kinds)
    args.memory_kinds = executable.owned.array(ctypes.c_void_p, addresses)[0]
    args.memory_kind_sizes = executable.owned.array(ctypes.c_size_t,
                                                    [len(k) for k in kinds])[0]


@slot
def Executable_OutputElementTypes(args):
    executable = _of(args.executable)
    args.output_types, args.num_output_types = executable.owned.array(
        ctypes.c_int, [abi.buffer_type(dtype) for dtype, _ in executable.output_types()])


@slot
def Executable_OutputDimensions(args):
    executable = _of(args.executable)
    shapes = [shape for _, shape in executable.output_types()]
    args.num_outputs = len(shapes)
    args.dims = executable.owned.array(ctypes.c_int64, [n for s in shapes for n in s])[0]
    args.dim_sizes = executable.owned.array(ctypes.c_size_t, [len(s) for s in shapes])[0]


@slot
def Executable_OptimizedProgram(args):
    """Format "hlo_with_config": jaxlib asks for the size first (code NULL), then fills."""
    executable = _of(args.executable)
    program = c.PJRT_Program.from_address(args.program)
    data = executable.optimized_program
    program.format, program.format_size = executable.owned.string("hlo_with_config")
    if program.code:
        if program.code_size < len(data):
            raise ValueError(f"OptimizedProgram: {program.code_size} bytes given, "
                             f"{len(data)} needed")
        ctypes.memmove(program.code, data, len(data))
    program.code_size = len(data)


@slot
def Executable_Fingerprint(args):
    executable = _of(args.executable)
    args.executable_fingerprint, args.executable_fingerprint_size = \
        executable.owned.string(executable.fingerprint)


@slot
def LoadedExecutable_Fingerprint(args):
    executable = _executable(args.executable)
    args.executable_fingerprint, args.executable_fingerprint_size = \
        executable.owned.string(executable.fingerprint)


_SERIALIZED: dict[int, Any] = {}  # serialized bytes alive until jaxlib calls the deleter


def _free_serialized(pointer: int) -> None:
    _SERIALIZED.pop(pointer, None)


_DELETER = abi.Deleter(_free_serialized)


@slot
def Executable_Serialize(args):
    data = ctypes.create_string_buffer(_of(args.executable).serialize())
    pointer = ctypes.addressof(data)
    _SERIALIZED[pointer] = data
    args.serialized_bytes, args.serialized_bytes_size = pointer, len(data.raw) - 1
    args.serialized_executable = pointer
    args.serialized_executable_deleter = ctypes.cast(_DELETER, ctypes.c_void_p).value


@slot
def Executable_DeserializeAndLoad(args):
    client = _the_client(args.client)
    options = ctypes.string_at(args.overridden_serialized_compile_options,
                               args.overridden_serialized_compile_options_size) \
        if args.overridden_serialized_compile_options else None
    executable = _executable_types().deserialize(
        client, ctypes.string_at(args.serialized_executable, args.serialized_executable_size),
        options)
    args.loaded_executable = _add_executable(executable)


@slot
def LoadedExecutable_AddressableDevices(args):
    executable = _executable(args.executable)
    args.addressable_devices, args.num_addressable_devices = \
        _device_pointers(executable, executable.addressable_devices)


@slot
def LoadedExecutable_AddressableDeviceLogicalIds(args):
    """(replica, partition) of each addressable device, in AddressableDevices' order."""
    executable = _executable(args.executable)
    ids = [value for d in executable.local
           for value in divmod(d, executable.num_partitions)]
    args.addressable_device_logical_ids, count = executable.owned.array(ctypes.c_int, ids)
    args.num_addressable_device_logical_ids = count // 2


@slot
def LoadedExecutable_GetDeviceAssignment(args):
    from jax_trn2.plugin import proto
    executable = _executable(args.executable)
    data = ctypes.create_string_buffer(proto.write_device_assignment(executable.assignment))
    pointer = ctypes.addressof(data)
    _SERIALIZED[pointer] = data
    args.serialized_bytes, args.serialized_bytes_size = pointer, len(data.raw) - 1
    args.serialized_device_assignment = pointer
    args.serialized_device_assignment_deleter = ctypes.cast(_DELETER, ctypes.c_void_p).value


@slot
def LoadedExecutable_Delete(args):
    _executable(args.executable).deleted = True


@slot
def LoadedExecutable_IsDeleted(args):
    args.is_deleted = _executable(args.executable).deleted


@slot
def LoadedExecutable_Execute(args):
    executable = _executable(args.executable)
    if args.execute_device:
        raise NotImplementedError("the trn2 plugin runs a program on all its devices at once "
                                  "(SPMD), not on one device of it")
    options = c.PJRT_ExecuteOptions.from_address(args.options) if args.options else None
    keep = set((ctypes.c_int64 * options.num_non_donatable_input_indices).from_address(
        options.non_donatable_input_indices)) if options is not None and \
        options.num_non_donatable_input_indices else set()
    rows = abi.pointers(args.argument_lists, args.num_devices)
    arguments = [[_get(p, Buffer) for p in abi.pointers(row, args.num_args)] for row in rows]
    results = executable.execute(arguments, keep)
    for row_address, row in zip(abi.pointers(args.output_lists, args.num_devices), results):
        abi.write_pointers(row_address, [_new_buffer(buffer) for buffer in row])
    if args.device_complete_events:
        abi.write_pointers(args.device_complete_events, [_READY] * len(results))


# --- PJRT's layouts extension (plugin.memory_layouts; its other slots are the shim's) ----

@extension_slot
def Layouts_PJRT_Client_GetDefaultLayout(args):
    """Row-major, whatever the element type and dims."""
    args.layout = memory_layouts.pointer(row_major(args.num_dims))


def _owned_layouts(executable, layouts) -> tuple[Any, int]:
    """An array of the PJRT layouts of `layouts` that `executable` keeps, and its length."""
    return executable.owned.array(ctypes.c_void_p,
                                  [memory_layouts.pointer(layout) for layout in layouts])


@extension_slot
def Layouts_PJRT_Executable_GetParameterLayouts(args):
    executable = _of(args.executable)
    args.layouts, args.num_parameters = _owned_layouts(
        executable, executable.parameter_memory_layouts)


@extension_slot
def Layouts_PJRT_Executable_GetOutputLayouts(args):
    executable = _of(args.executable)
    args.layouts, args.num_outputs = _owned_layouts(executable,
                                                    executable.output_memory_layouts)


# --- PJRT's shardings extension ---------------------------------------------------------

@extension_slot
def Shardings_PJRT_Executable_ParameterShardings(args):
    """The parameters' shardings: jaxlib asks for them (and the outputs') as it compiles,
    through the optimized program when a plugin has no shardings extension."""
    executable = _of(args.executable)
    args.shardings, args.sharding_sizes, args.num_parameters = _owned_shardings(
        executable, executable.op_shardings[0])


@extension_slot
def Shardings_PJRT_Executable_OutputShardings(args):
    executable = _of(args.executable)
    args.shardings, args.sharding_sizes, args.num_outputs = _owned_shardings(
        executable, executable.op_shardings[1])


def _owned_shardings(executable, shardings: list[bytes]) -> tuple[int, int, int]:
    """C arrays of the serialized OpShardings `shardings` and of their sizes, which
    `executable` keeps, and their count."""
    pointers = [executable.owned.string(data)[0] for data in shardings]
    return (executable.owned.array(ctypes.c_void_p, pointers)[0],
            executable.owned.array(ctypes.c_size_t, [len(d) for d in shardings])[0],
            len(shardings))


# --- the table ----------------------------------------------------------------------------

def build(shim: ctypes.CDLL) -> Any:
    """A PJRT_Api with every slot this module and the C shim define (the others NULL)."""
    global _READY
    shim.trn2_ready_event.restype = ctypes.c_void_p
    _READY = shim.trn2_ready_event()
    noop = ctypes.cast(shim.trn2_noop, ctypes.c_void_p).value
    api = c.PJRT_Api()
    api.struct_size = c.PJRT_Api_STRUCT_SIZE
    api.pjrt_api_version.struct_size = c.PJRT_Api_Version_STRUCT_SIZE
    api.pjrt_api_version.major_version = abi.API_MAJOR
    api.pjrt_api_version.minor_version = abi.API_MINOR
    for name, function in _SLOTS.items():
        setattr(api, name, ctypes.cast(function, ctypes.c_void_p).value)
    _EXTENSIONS.append(abi.extension("Shardings", _EXTENSION_SLOTS["Shardings"]))
    _EXTENSIONS.append(memory_layouts.extension(_EXTENSION_SLOTS["Layouts"], shim,
                                                next_extension=_EXTENSIONS[-1]))
    api.extension_start = ctypes.addressof(_EXTENSIONS[-1])
    for name in GUARDED_SLOTS:  # the shim calls the Python slot, its error state kept
        setter = getattr(shim, f"trn2_set_{name}")
        setter.argtypes = [ctypes.c_void_p]
        setter(getattr(api, f"PJRT_{name}"))
        setattr(api, f"PJRT_{name}", ctypes.cast(getattr(shim, f"trn2_{name}"),
                                                 ctypes.c_void_p).value)
    for name in FAST_SLOTS:
        setattr(api, f"PJRT_{name}", ctypes.cast(getattr(shim, f"trn2_{name}"),
                                                 ctypes.c_void_p).value)
    atexit.register(_retire, api, noop, shim)
    return api


def _retire(api: Any, noop: int, shim: ctypes.CDLL) -> None:
    """Wait for jax's runtime tokens, then point every slot at the shim's no-op, and have
    the shim drop the destroys it deferred (see the module docstring and _shim.c).

    jax's own exit handlers, registered before the plugin's and so run after it, wait for
    the runtime tokens of ordered effects (`jax.debug.print(..., ordered=True)`): on the
    no-op slots a trn2 token would read as a deleted buffer, or hang. Waiting here first
    leaves them none."""
    try:
        jax.effects_barrier()
    finally:
        shim.trn2_retire()
    for name in abi.SLOTS:
        if getattr(api, name):
            setattr(api, name, noop)
