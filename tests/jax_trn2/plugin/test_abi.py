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
              "Memory_Kind": ["memory", "kind", "kind_size"], "Error_Destroy": ["error"]}
    destroys = {"Buffer_Destroy": ["buffer"], "Executable_Destroy": ["executable"],
                "LoadedExecutable_Destroy": ["executable"], "Client_Destroy": ["client"]}
    assert sorted(fields) == sorted(table.FAST_SLOTS + ("Error_Destroy",))
    fields.update(destroys)  # the shim keeps their object when it defers them
    for name, names in fields.items():
        struct = getattr(c, f"PJRT_{name}_Args")
        assert [getattr(struct, f).offset for f in names] == [16, 24, 32][:len(names)], name
    from jax_trn2.plugin.handles import Record
    assert [getattr(Record, f).offset for f in ("vtable", "device", "memory", "kind",
                                                "kind_size", "deleted")] == [0, 8, 16, 24, 32, 40]


def test_a_destroy_on_a_thread_python_does_not_know_runs_on_pythons():
    """jaxlib destroys objects on its own threads too; the shim must not take the GIL there
    (Python ends such a thread when it finalises, which aborts the process: _shim.c) but
    defer the destroy to a thread Python knows. The native thread here is libc's."""
    import threading

    import jax
    from jax_trn2.plugin import library_path, table
    jax.devices("trn2")  # the plugin's table built
    shim = ctypes.CDLL(library_path())
    freed_on = []

    class Object:
        def __del__(self):
            freed_on.append(threading.get_ident())

    def destroy_args(pointer):
        args = c.PJRT_Executable_Destroy_Args()
        args.struct_size = c.PJRT_Executable_Destroy_Args_STRUCT_SIZE
        args.executable = pointer
        return args

    pointer = table.HANDLES.add(Object())
    args = destroy_args(pointer)
    libc = ctypes.CDLL(None)
    thread = ctypes.c_ulong()
    assert libc.pthread_create(ctypes.byref(thread), None, shim.trn2_Executable_Destroy,
                               ctypes.byref(args)) == 0
    assert libc.pthread_join(thread, None) == 0
    # a destroy made on this thread runs the deferred ones first (unless Python's main
    # thread has already run them)
    nothing = destroy_args(0)
    assert shim.trn2_Executable_Destroy(ctypes.byref(nothing)) == 0
    assert freed_on and freed_on[0] in (threading.get_ident(), threading.main_thread().ident)
    with pytest.raises(ValueError, match="not a live"):
        table.HANDLES.get(pointer, Object)
