"""The kernel of each instruction class, filled by the `kernel` decorator as the kernel
modules are imported (mesh.isa.kernels imports them all)."""

from __future__ import annotations

from typing import Callable

from mesh import isa

KERNELS: dict[type, Callable] = {}


def kernel(*instruction_types: type) -> Callable:
    """Register the decorated function as the kernel of these instruction classes."""

    def register(fn: Callable) -> Callable:
        for cls in instruction_types:
            KERNELS[cls] = fn
        return fn

    return register


def kernel_for(instr: isa.Instruction) -> Callable:
    """The kernel of `instr`'s class; NotImplementedError naming the class if it has none."""
    try:
        return KERNELS[type(instr)]
    except KeyError:
        raise NotImplementedError(f"no executor kernel for instruction {type(instr).__name__}") \
            from None
