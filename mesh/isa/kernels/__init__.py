"""Semantics of the instruction set: one kernel per instruction class.

A kernel is a plain array function `kernel(instr, args, ctx) -> list of arrays` over values in
the executor's layout (leading logical-mesh dims, size 1 where a value is replicated; see
mesh.isa). Kernels read like the StableHLO spec of the op they implement.
"""

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
    try:
        return KERNELS[type(instr)]
    except KeyError:
        raise NotImplementedError(f"no executor kernel for instruction {type(instr).__name__}") \
            from None


# Importing the kernel modules fills KERNELS.
from mesh.isa.kernels import (  # noqa: E402,F401
    bits, callbacks, collectives, control_flow, convolution, elementwise, fft, indexing,
    linalg, matmul, movement, ragged_matmul, reduction, sort, windows)
