"""What a kernel may ask of the executor: the mesh and the layout of values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax.numpy as jnp

from mesh import isa


@dataclass(frozen=True)
class KernelContext:
    """The running program and its mesh; `nm` leading dims of every array are mesh dims."""

    program: isa.Program
    run: Callable  # run(sub_program, args) -> results, for ops with a body (reduce, while)
    rounding: Callable | None = None  # rounding(x, dtype_name); None: round-to-nearest-even

    @property
    def mesh(self) -> isa.MeshSpec:
        return self.program.mesh

    @property
    def nm(self) -> int:
        return self.program.mesh.rank

    def out_info(self, instr: isa.Instruction, i: int = 0) -> isa.ValueInfo:
        return self.program.values[instr.outs[i]]

    def out_shape(self, instr: isa.Instruction, i: int = 0) -> tuple[int, ...]:
        """Full array shape (mesh dims + local dims) of output i."""
        return self.program.array_shape(instr.outs[i])

    def full(self, x: jnp.ndarray) -> jnp.ndarray:
        """x broadcast to vary along every mesh axis."""
        return jnp.broadcast_to(x, tuple(self.mesh.axis_sizes) + x.shape[self.nm:])

    def fit(self, x: jnp.ndarray, instr: isa.Instruction, i: int = 0) -> jnp.ndarray:
        """A result computed on every chip (full mesh dims) cut down to the layout of
        output i: one copy along the axes where it is declared replicated."""
        varying = self.out_info(instr, i).varying
        return x[tuple(slice(None) if a in varying else slice(0, 1) for a in range(self.nm))]
