"""What a kernel may ask of the executor: the mesh and the layout of values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import jax.numpy as jnp
from jax.sharding import Mesh

from mesh import isa


@dataclass(frozen=True)
class KernelContext:
    """The running program and its mesh; `nm` leading dims of every array are mesh dims."""

    program: isa.Program
    # run(sub_program, args, active=None) -> results, for ops with a body (reduce, while)
    run: Callable
    rounding: Callable | None = None  # rounding(x, dtype_name); None: round-to-nearest-even
    # The chips whose control flow reaches this program ([mesh...] bool, size 1 along axes
    # it does not vary on), where a conditional or loop differs from chip to chip and runs
    # a body for all chips: side effects (host callbacks) happen on these chips only.
    # None: every chip.
    active: jnp.ndarray | None = None
    # The devices the executor's computation is split over, as a 1-D mesh (axis
    # "executor"); None: one device.
    executor: Mesh | None = None
    # Whether the executor runs on CPU devices, where matmuls of several BF16 or FP32
    # passes run in the native loop (mesh.isa.kernels.native); else as host GEMMs.
    on_cpu: bool = True
    # Of the program's values made so far: value -> (the instruction that made it, its
    # arguments), so that a kernel may compute its result from what made its operand
    made_by: dict = field(default_factory=dict, compare=False)
    # value -> how many times the program uses it (as an instruction's argument or an
    # output of the program)
    uses: dict = field(default_factory=dict, compare=False)
    # Values the program returns, and nothing else uses, that a kernel may make as
    # mesh.sharding.PerChip, one array per chip (compile_program's `chip_outputs` of
    # PER_CHIP_MIN_BYTES or more), rather than as one array
    per_chip: frozenset = frozenset()

    def run_on(self, program: isa.Program, args, reached: jnp.ndarray):
        """Run a sub-program that only the chips where `reached` holds get to."""
        active = reached if self.active is None else self.active & reached
        return self.run(program, args, active)

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
