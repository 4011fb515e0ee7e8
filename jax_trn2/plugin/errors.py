"""PJRT_Error: how a Python exception in a slot reaches jaxlib, and back.

A Python exception escaping a ctypes callback is printed and the callback returns NULL,
which PJRT reads as success: every slot is wrapped by `slot`, which turns any exception
into a PJRT_Error with a status code jaxlib raises as JaxRuntimeError ("INVALID_ARGUMENT:
..."). The exception itself is remembered by its message for a while, so that
jax_trn2.jit can raise the simulator's own error type (OutOfHBMError, UnsupportedOpError,
...) where jax raises JaxRuntimeError (`original`).
"""

from __future__ import annotations

import collections
import ctypes
import threading
import traceback
from typing import Any, Callable

from jax_trn2.plugin import abi
from jax_trn2.plugin.abi import c
from jax_trn2.plugin.handles import Handles, Record

# How many raised exceptions `original` can still find (the latest ones).
_REMEMBERED = 64


class PjrtError:
    """A PJRT_Error: a status code and message, owned by the caller until Error_Destroy."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        self.owned = abi.Owned()


def code_of(error: BaseException) -> int:
    """The PJRT status code for a Python exception, as absl names the failure: bad input is
    INVALID_ARGUMENT, a missing rule UNIMPLEMENTED, running out of (simulated or host)
    memory RESOURCE_EXHAUSTED, a run that cannot go on FAILED_PRECONDITION."""
    from mesh.memory import OutOfHBMError  # the simulator, imported once it is in use
    if isinstance(error, (OutOfHBMError, MemoryError)):
        return c.PJRT_Error_Code_RESOURCE_EXHAUSTED
    if isinstance(error, NotImplementedError):  # UnsupportedOpError is one too
        return c.PJRT_Error_Code_UNIMPLEMENTED
    if isinstance(error, (ValueError, TypeError)):  # LoweringError is a ValueError
        return c.PJRT_Error_Code_INVALID_ARGUMENT
    if isinstance(error, (KeyError, IndexError, LookupError)):
        return c.PJRT_Error_Code_NOT_FOUND
    if isinstance(error, KeyboardInterrupt):
        return c.PJRT_Error_Code_CANCELLED
    if isinstance(error, RuntimeError):  # SplitCollectiveError: the run cannot complete
        return c.PJRT_Error_Code_FAILED_PRECONDITION
    return c.PJRT_Error_Code_INTERNAL


class _Vtable(ctypes.Structure):
    """PJRT_Error_FunctionTable: jaxlib reads an error through it (PJRT_Error is a struct
    whose first field points to it)."""

    _fields_ = [("struct_size", ctypes.c_size_t), ("instance_size", ctypes.c_size_t),
                ("extension_start", ctypes.c_void_p), ("destroy", ctypes.c_void_p),
                ("message", ctypes.c_void_p), ("get_code", ctypes.c_void_p),
                ("for_each_payload", ctypes.c_void_p)]


_DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_MESSAGE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_size_t))
_GET_CODE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_FOR_EACH_PAYLOAD = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class Errors:
    """The errors handed to jaxlib (alive until destroyed), and the exceptions behind the
    latest of them."""

    def __init__(self, handles: Handles):
        self._handles = handles
        self._raised: collections.OrderedDict[str, BaseException] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._functions = (_DESTROY(self.destroy), _MESSAGE(self._message),
                           _GET_CODE(self._code), _FOR_EACH_PAYLOAD(lambda *_: None))
        self._vtable = _Vtable(ctypes.sizeof(_Vtable), ctypes.sizeof(ctypes.c_void_p), None,
                               *(ctypes.cast(f, ctypes.c_void_p).value for f in self._functions))

    def new(self, code: int, message: str) -> int:
        """A new PJRT_Error* for jaxlib to destroy."""
        return self._handles.add(PjrtError(code, message),
                                 Record(vtable=ctypes.addressof(self._vtable)))

    def get(self, pointer: int) -> PjrtError:
        return self._handles.get(pointer, PjrtError)

    def destroy(self, pointer: int) -> None:
        self._handles.remove(pointer or 0)

    def _message(self, pointer: int, message: Any, size: Any) -> None:
        error = self.get(pointer)
        message[0], size[0] = error.owned.string(error.message)

    def _code(self, pointer: int) -> int:
        return self.get(pointer).code

    def from_exception(self, error: BaseException) -> int:
        message = f"{type(error).__name__}: {error}" if not _plain(error) else str(error)
        with self._lock:
            self._raised[message] = error
            while len(self._raised) > _REMEMBERED:
                self._raised.popitem(last=False)
        return self.new(code_of(error), message)

    def original(self, message: str) -> BaseException | None:
        """The exception a JaxRuntimeError's message came from (jaxlib prefixes the status
        code: "INVALID_ARGUMENT: ..."), if it is one of the latest."""
        with self._lock:
            for text, error in reversed(self._raised.items()):
                if message.endswith(text):
                    return error
        return None

    def slot(self, function: Callable[[Any], Any]) -> Any:
        """`function(args)` as a PJRT_Api slot: its args struct decoded from the slot's name
        (`PJRT_<name>_Args`), any exception returned as a PJRT_Error, never raised into
        ctypes."""
        name = function.__name__
        struct = getattr(c, f"PJRT_{name}_Args", None)

        def call(address: int) -> int | None:
            try:
                function(struct.from_address(address) if struct is not None else address)
                return None
            except BaseException as error:  # noqa: BLE001 - every one must become a PJRT_Error
                try:
                    return self.from_exception(error)
                except BaseException:  # noqa: BLE001 - making the error failed: say so
                    traceback.print_exc()
                    return self.new(c.PJRT_Error_Code_INTERNAL, f"{name} failed")

        return abi.SlotFunction(call)


def _plain(error: BaseException) -> bool:
    """Errors whose message says all (the simulator's own): no type name in front."""
    module = type(error).__module__ or ""
    return module.split(".")[0] in ("lowering", "mesh", "jax_trn2")

