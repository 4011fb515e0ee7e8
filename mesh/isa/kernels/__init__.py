"""Semantics of the instruction set: one kernel per instruction class.

A kernel is a plain array function `kernel(instr, args, ctx) -> list of arrays` over values in
the executor's layout (leading logical-mesh dims, size 1 where a value is replicated; see
mesh.isa). Kernels read like the StableHLO spec of the op they implement; each module
registers its kernels (mesh.isa.kernels.registry) as it is imported, here.
"""

from mesh.isa.kernels import (  # noqa: F401
    bits, callbacks, collectives, control_flow, convolution, elementwise, fft, indexing,
    linalg, matmul, movement, ragged_matmul, reduction, sort, windows)
from mesh.isa.kernels.registry import KERNELS, kernel, kernel_for  # noqa: F401
