"""The objects behind the opaque PJRT pointers jaxlib holds: one small class each.

A pointer handed to jaxlib is the address of a Record, kept in `Handles` with its Python
object until jaxlib destroys it (clients, devices and memories live as long as the
process). Each object owns the C values its getters hand out (abi.Owned).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from jax_trn2.plugin import abi
from mesh import sharding
from mesh.memory_layout import in_memory, row_major

T = TypeVar("T")


class Record(ctypes.Structure):
    """What a PJRT pointer handed to jaxlib points at (the C shim's trn2_record): the
    function table PJRT_Memory and PJRT_Error begin with (jaxlib reads it), then what the
    shim's getters read without calling Python (a buffer's device, memory, deleted
    flag and memory layout (a plugin.memory_layouts.LayoutRecord); a memory's kind; an
    executable's replicas, partitions and outputs)."""

    _fields_ = [("vtable", ctypes.c_void_p), ("device", ctypes.c_void_p),
                ("memory", ctypes.c_void_p), ("kind", ctypes.c_void_p),
                ("kind_size", ctypes.c_size_t), ("deleted", ctypes.c_bool),
                ("num_replicas", ctypes.c_size_t), ("num_partitions", ctypes.c_size_t),
                ("num_outputs", ctypes.c_size_t), ("memory_layout", ctypes.c_void_p)]


class Handles:
    """Python objects by the pointer jaxlib holds for them: the address of the object's
    Record."""

    def __init__(self):
        self._objects: dict[int, tuple[Any, Record]] = {}
        self._pointers: dict[int, int] = {}  # id(object) -> its pointer

    def add(self, obj: Any, record: Record | None = None) -> int:
        """Keep `obj` alive and return its pointer (of `record`, else a new empty one)."""
        record = Record() if record is None else record
        pointer = ctypes.addressof(record)
        self._objects[pointer] = (obj, record)
        self._pointers[id(obj)] = pointer
        return pointer

    def pointer(self, obj: Any) -> int:
        """The pointer of an object added before."""
        return self._pointers[id(obj)]

    def get(self, pointer: int, kind: type[T]) -> T:
        """The object at `pointer`, which must be a `kind`; ValueError otherwise (a pointer
        jaxlib should not have passed)."""
        obj = self._objects.get(pointer, (None, None))[0]
        if not isinstance(obj, kind):
            raise ValueError(f"{pointer:#x} is not a live PJRT {kind.__name__} of the trn2 "
                             f"plugin (got {type(obj).__name__})")
        return obj

    def remove(self, pointer: int) -> None:
        """Forget the object at `pointer` (NULL and unknown pointers are ignored, as PJRT's
        Destroy functions accept NULL)."""
        obj, _ = self._objects.pop(pointer, (None, None))
        if obj is not None and self._pointers.get(id(obj)) == pointer:
            del self._pointers[id(obj)]

    def __len__(self) -> int:
        return len(self._objects)

    def __contains__(self, pointer: int) -> bool:
        return pointer in self._objects


class MemoryVtable:
    """PJRT_Memory_FunctionTable: the user data jaxlib attaches to a memory, by key."""

    _GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
    _SET = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p)

    class _Table(ctypes.Structure):
        _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                    ("instance_struct_size", ctypes.c_size_t),
                    ("get_user_data", ctypes.c_void_p), ("set_user_data", ctypes.c_void_p)]

    def __init__(self):
        self._data: dict[tuple[int, int], int] = {}
        self._get, self._set = self._GET(self._get_data), self._SET(self._set_data)
        self.table = self._Table(ctypes.sizeof(self._Table), None, ctypes.sizeof(ctypes.c_void_p),
                                 ctypes.cast(self._get, ctypes.c_void_p).value,
                                 ctypes.cast(self._set, ctypes.c_void_p).value)
        self.address = ctypes.addressof(self.table)

    def _get_data(self, memory: int, key: int) -> int:
        return self._data.get((memory or 0, key or 0), 0)

    def _set_data(self, memory: int, key: int, data: int, destructor: int) -> None:
        # memories live as long as the process: their user data is never destroyed
        self._data[(memory or 0, key or 0)] = data or 0


# A device's memory spaces by jax's names, its default first: its HBM ("device"), and the
# host's memory behind it, as TPU and GPU devices have them (jax offloads to
# "pinned_host"). A memory's kind id is its index here.
MEMORY_KINDS = ("device", "pinned_host", "unpinned_host")
DEVICE_MEMORY_KIND = MEMORY_KINDS[0]


@dataclass(eq=False)
class Memory:
    """A device's memory space: its HBM, or the host memory it reads and writes over the
    host link (MEMORY_KINDS)."""

    id: int
    kind: str
    device: "Device"
    owned: abi.Owned = field(default_factory=abi.Owned)

    def __post_init__(self) -> None:
        if self.kind not in MEMORY_KINDS:
            raise ValueError(f"memory kind {self.kind!r} is not one of {MEMORY_KINDS}")

    @property
    def kind_id(self) -> int:
        return MEMORY_KINDS.index(self.kind)

    @property
    def is_hbm(self) -> bool:
        return self.kind == DEVICE_MEMORY_KIND

    def description(self) -> str:
        device = self.device
        where = f"chip {device.machine_device}" if not device.kind_has_cores else \
            f"the chip at {device.coords[:-1]}, logical core {device.core_on_chip}'s share"
        memory = "HBM of Trainium2" if self.is_hbm else "host memory of Trainium2"
        return f"{memory} {where} (memory kind {self.kind!r})"


@dataclass(eq=False)
class Device:
    """One simulated chip, as a PJRT_Device and its PJRT_DeviceDescription (one object:
    jaxlib never frees either)."""

    id: int  # the device id jax sees (jax.devices("trn2") is in id order)
    coords: tuple[int, ...]
    kind: str
    hbm_bytes: int  # capacity: the chip's, or its logical core's share (Topology.device)
    # the machine device id (mesh.machine): the chip id on the torus (row-major over
    # coords), or on a machine of logical NeuronCores chip * cores per chip + core
    machine_device: int
    process_index: int = 0  # the jax.distributed process that owns it
    addressable: bool = True  # owned by this process
    memories: list[Memory] = field(default_factory=list)
    owned: abi.Owned = field(default_factory=abi.Owned)
    kind_has_cores: bool = False  # coords end with the core on the chip
    bytes_in_use: int = 0  # of the buffers on this chip now
    peak_bytes_in_use: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def attributes(self) -> dict[str, Any]:
        """PJRT_DeviceDescription_Attributes: jax reads `coords` as TPU devices have it."""
        return {"coords": list(self.coords), "core_on_chip": self.core_on_chip}

    @property
    def core_on_chip(self) -> int:
        """The logical core's index on its chip (coords' last entry on a machine of
        logical cores, whose coords have one more entry than the torus has axes)."""
        return self.coords[-1] if self.kind_has_cores else 0

    def to_string(self) -> str:
        return f"Trn2Device(id={self.id}, coords={self.coords})"

    def memory(self, kind: str) -> Memory:
        """This device's memory of `kind` (one of MEMORY_KINDS)."""
        for memory in self.memories:
            if memory.kind == kind:
                return memory
        raise ValueError(f"{self.to_string()} has no memory of kind {kind!r}; its kinds: "
                         f"{[m.kind for m in self.memories]}")

    def allocated(self, nbytes: int) -> None:
        """Account a buffer of `nbytes` made in this chip's HBM (memory_stats)."""
        with self.lock:
            self.bytes_in_use += nbytes
            self.peak_bytes_in_use = max(self.peak_bytes_in_use, self.bytes_in_use)

    def freed(self, nbytes: int) -> None:
        with self.lock:
            self.bytes_in_use -= nbytes


class Whole:
    """A global array and how it lies over a mesh's devices: the one storage that the
    buffers of its pieces share (a replicated value is stored once for all its devices).

    `value` is what the simulator takes and gave (a numpy array or a jax.Array); or, for a
    result it gave as its chips' pieces (`chips`: the executor's array of them, or a
    mesh.sharding.PerChip; mesh.sharding.unshard), the global array assembled from them
    when first taken. The devices' buffers of such a result are their own chips' pieces
    (mesh.sharding.device_pieces): where the chips' pieces vary along an axis the layout
    replicates over (a shard_map's result that check_vma=False lets differ, jax's eager
    shard_map's per-device values), they differ from the global array's, which takes chip
    0's: a program that takes them computes on those, where XLA's devices each take their
    own."""

    def __init__(self, layout: tuple, sizes: tuple[int, ...], value: Any = None,
                 chips: np.ndarray | sharding.PerChip | None = None):
        self.layout = layout  # mesh axes of each dim (mesh.sharding)
        self.sizes = sizes  # the mesh's axis sizes
        self._value, self._chips = value, chips

    @property
    def value(self) -> Any:
        if self._value is None:  # (two threads may both assemble it: the same array)
            self._value = sharding.unshard(self._chips, self.layout, self.sizes)
            self._chips = None
        return self._value


class Buffer:
    """A PJRT_Buffer: one device's array (a read-only numpy array on the host, its logical
    value) and its memory layout, the order of its elements in the buffer's memory
    (mesh.memory_layout; default row-major), which plugin.memory_layouts gives its bytes in.

    `whole` is the global array this buffer is piece `index` of (an executable's result,
    or an argument assembled from its pieces once): the next execute that takes all its
    pieces, laid out the same, takes the whole as it is. A token (`token`: of an ordered
    effect, or lax.create_token's) holds no data: its dtype is None (PJRT's TOKEN) and its
    shape (), as XLA's token buffers, which jax cannot read as an array."""

    def __init__(self, array: np.ndarray, device: Device, memory: Memory,
                 whole: Whole | None = None, index: int = 0, token: bool = False,
                 memory_layout: tuple[int, ...] | None = None):
        array.flags.writeable = False  # shared between buffers and with the executor
        self.array = array
        self.device = device
        self.memory = memory
        self.whole, self.index = whole, index
        self.deleted = False
        self.record = Record()  # the table fills in its device, memory and layout pointers
        self.owned = abi.Owned()
        self.dtype, self.shape, self.nbytes = array.dtype, array.shape, array.nbytes
        if token:
            self.dtype, self.shape = None, ()
        self.memory_layout = row_major(len(self.shape)) if memory_layout is None else \
            memory_layout
        self._in_memory: np.ndarray | None = None  # its bytes in its layout, once asked for
        self.hbm_bytes = self.nbytes if memory.is_hbm else 0  # host memory is not HBM
        device.allocated(self.hbm_bytes)

    def share(self, view: np.ndarray, whole: Whole, index: int) -> None:
        """Hold piece `index` of `whole` (equal to this buffer's data) instead of a copy of
        its own."""
        view.flags.writeable = False
        self.array, self.whole, self.index = view, whole, index

    def delete(self) -> None:
        """Release the data (PJRT_Buffer_Delete, donation); the handle lives on."""
        if not self.deleted:
            self.deleted = self.record.deleted = True
            self.device.freed(self.hbm_bytes)
            self.array = self.whole = self._in_memory = None

    def data(self) -> np.ndarray:
        if self.deleted:
            raise ValueError("the buffer was deleted (donated to a computation, or deleted)")
        return self.array

    def in_memory(self) -> np.ndarray:
        """The buffer's bytes as its layout orders them (a C-contiguous array), kept as long
        as the buffer is (Buffer_UnsafePointer hands out their address)."""
        if self._in_memory is None:
            self._in_memory = in_memory(self.data(), self.memory_layout)
        return self._in_memory

    def __repr__(self) -> str:
        return f"Buffer({self.dtype}{list(self.shape)} on {self.device.to_string()})"
