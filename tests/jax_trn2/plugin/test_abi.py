"""The ABI layouts the plugin uses, at the offsets of PJRT's C header (x86-64): a pypjrt
release with other layouts fails here, not in jaxlib."""

import ctypes

import pytest

from jax_trn2.plugin import abi
from jax_trn2.plugin.abi import c


def test_api_table_slots_are_where_jaxlib_reads_them():
    # struct_size, extension_start, PJRT_Api_Version (24 bytes), then one pointer per slot
    assert c.PJRT_Api.PJRT_Error_Destroy.offset == 40
    assert c.PJRT_Api.PJRT_Client_Create.offset == 40 + 8 * 10
    assert c.PJRT_Api.PJRT_LoadedExecutable_Execute.offset == 40 + 8 * 55
    assert c.PJRT_Api.PJRT_Error_ForEachPayload.offset == 40 + 8 * 132
    assert abi.SLOTS[0] == "PJRT_Error_Destroy"


def test_args_structs_the_plugin_reads():
    assert [(f, getattr(c.PJRT_LoadedExecutable_Execute_Args, f).offset) for f in
            ("executable", "options", "argument_lists", "num_devices", "num_args",
             "output_lists", "device_complete_events", "execute_device")] == \
        [("executable", 16), ("options", 24), ("argument_lists", 32), ("num_devices", 40),
         ("num_args", 48), ("output_lists", 56), ("device_complete_events", 64),
         ("execute_device", 72)]
    # send_callbacks, recv_callbacks, num_send_ops, num_recv_ops, launch_id (int, padded)
    assert c.PJRT_ExecuteOptions.non_donatable_input_indices.offset == 56
    assert c.PJRT_Client_BufferFromHostBuffer_Args.buffer.offset == 112
    assert ctypes.sizeof(c.PJRT_NamedValue) == 56


def test_fields_appended_after_jaxlibs_version_are_checked():
    """MemoryStats' peak_allocated_bytes came in PJRT 0.113: a 0.112 caller's struct ends
    before it."""
    args = c.PJRT_Device_MemoryStats_Args()
    args.struct_size = c.PJRT_Device_MemoryStats_Args.peak_allocated_bytes.offset
    assert not abi.has_field(args, "peak_allocated_bytes_is_set")
    args.struct_size = ctypes.sizeof(args)
    assert abi.has_field(args, "peak_allocated_bytes_is_set")


def test_the_shims_getters_write_where_jaxlib_reads():
    """_shim.c reads the object at offset 16 of an args struct (its getters and the
    destroys) and writes its out-fields
    at 24 and 32 (trn2_args); the records it reads are handles.Record."""
    from jax_trn2.plugin import table
    fields = {"Event_IsReady": ["event", "is_ready"], "Event_OnReady": ["event", "callback",
                                                                        "user_arg"],
              "Event_Destroy": ["event"], "Event_Error": ["event"], "Event_Await": ["event"],
              "Buffer_ReadyEvent": ["buffer", "event"], "Buffer_Device": ["buffer", "device"],
              "Buffer_Memory": ["buffer", "memory"], "Buffer_IsDeleted": ["buffer", "is_deleted"],
              "Memory_Kind": ["memory", "kind", "kind_size"], "Error_Destroy": ["error"],
              "Executable_NumReplicas": ["executable", "num_replicas"],
              "Executable_NumPartitions": ["executable", "num_partitions"],
              "Executable_NumOutputs": ["executable", "num_outputs"]}
    destroys = {"Buffer_Destroy": ["buffer"], "Executable_Destroy": ["executable"],
                "LoadedExecutable_Destroy": ["executable"], "Client_Destroy": ["client"]}
    assert sorted(fields) == sorted(table.FAST_SLOTS + ("Error_Destroy",))
    fields.update(destroys)  # the shim keeps their object when it defers them
    for name, names in fields.items():
        struct = getattr(c, f"PJRT_{name}_Args")
        assert [getattr(struct, f).offset for f in names] == [16, 24, 32][:len(names)], name
    from jax_trn2.plugin.handles import Record
    assert [getattr(Record, f).offset for f in ("vtable", "device", "memory", "kind",
                                                "kind_size", "deleted", "num_replicas",
                                                "num_partitions", "num_outputs",
                                                "memory_layout")] == \
        [0, 8, 16, 24, 32, 40, 48, 56, 64, 72]


def test_the_shims_layout_slots_write_where_jaxlib_reads():
    """_shim.c's slots of the layouts extension: Buffer_MemoryLayout as the getters above,
    MemoryLayout_Serialize by its own struct (trn2_serialize_args), reading a
    plugin.memory_layouts.LayoutRecord (trn2_layout)."""
    from jax_trn2.plugin.memory_layouts import LayoutRecord
    args = c.PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args
    assert (args.buffer.offset, args.layout.offset) == (16, 24)
    args = c.PJRT_Layouts_MemoryLayout_Serialize_Args
    assert [getattr(args, f).offset for f in ("layout", "serialized_bytes",
                                              "serialized_bytes_size", "serialized_layout",
                                              "serialized_layout_deleter")] == \
        [16, 24, 32, 40, 48]
    assert (LayoutRecord.text.offset, LayoutRecord.size.offset) == (0, 8)


def destroy_on_a_native_thread() -> tuple[list[int], int]:
    """Have a thread of libc's, which Python does not know, destroy an object of the
    plugin's (as jaxlib does on its own threads): the threads the object was freed on (when
    it is), and its pointer."""
    import threading

    import jax
    from jax_trn2.plugin import library_path, table
    jax.devices("trn2")  # the plugin's table built
    freed_on = []

    class Object:
        def __del__(self):
            freed_on.append(threading.get_ident())

    args = destroy_args(table.HANDLES.add(Object()))
    shim, libc, thread = ctypes.CDLL(library_path()), ctypes.CDLL(None), ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(thread), None, shim.trn2_Executable_Destroy,
                               ctypes.byref(args)) == 0
    assert libc.pthread_join(thread, None) == 0
    return freed_on, args.executable


def destroy_args(pointer: int):
    args = c.PJRT_Executable_Destroy_Args()
    args.struct_size = c.PJRT_Executable_Destroy_Args_STRUCT_SIZE
    args.executable = pointer
    return args


def test_a_destroy_on_a_thread_python_does_not_know_runs_on_one_it_does():
    """The shim must not take the GIL on such a thread (Python ends it when it finalises,
    which aborts the process: _shim.c): the next destroy made on a thread Python knows runs
    it first (unless Python's main thread has already run it)."""
    import threading

    from jax_trn2.plugin import library_path, table
    freed_on, pointer = destroy_on_a_native_thread()
    shim = ctypes.CDLL(library_path())
    assert shim.trn2_Executable_Destroy(ctypes.byref(destroy_args(0))) == 0
    assert freed_on and freed_on[0] in (threading.get_ident(), threading.main_thread().ident)
    assert pointer not in table.HANDLES


def test_a_deferred_destroy_runs_on_pythons_main_thread_by_itself():
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Python runs its pending calls on the main thread, which this is not")
    freed_on, _ = destroy_on_a_native_thread()
    deadline = time.monotonic() + 10
    while not freed_on and time.monotonic() < deadline:
        sum(range(1000))  # bytecode, between which Python runs its pending calls
    assert freed_on == [threading.main_thread().ident]


@pytest.mark.parametrize("name, field", [("NumReplicas", "num_replicas"),
                                         ("NumPartitions", "num_partitions"),
                                         ("NumOutputs", "num_outputs")])
def test_the_shim_answers_an_executables_counts(name, field):
    """jaxlib asks for them on every call of an executable: the shim answers from the
    executable's Record, without calling Python."""
    import types

    import jax
    from jax_trn2.plugin import library_path, table
    jax.devices("trn2")  # the plugin's table built
    executable = types.SimpleNamespace(num_replicas=2, num_partitions=8, num_outputs=3)
    args = getattr(c, f"PJRT_Executable_{name}_Args")()
    args.struct_size = ctypes.sizeof(args)
    args.executable = table._add_executable(executable)
    try:
        getter = getattr(ctypes.CDLL(library_path()), f"trn2_Executable_{name}")
        getter.restype = ctypes.c_void_p
        assert getter(ctypes.byref(args)) is None  # no error
        assert getattr(args, field) == getattr(executable, field)
    finally:
        table.HANDLES.remove(args.executable)
