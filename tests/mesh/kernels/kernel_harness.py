"""Calling one executor kernel directly: a one-instruction program over a small mesh, its
operands in the executor's layout (leading mesh dims, size 1 where a value is replicated).
Sub-programs (loop bodies, branches, reducer bodies) run on the executor (run_program)."""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mesh import dtypes, isa
from mesh.executor import run_program
from mesh.isa.kernels import kernel_for
from mesh.isa.kernels.context import KernelContext


def info_of(array: np.ndarray, nm: int) -> isa.ValueInfo:
    """The value an executor array holds: varying along the mesh dims of size > 1."""
    varying = frozenset(a for a in range(nm) if array.shape[a] > 1)
    return isa.ValueInfo(isa.TensorType(tuple(array.shape[nm:]),
                                        dtypes.dtype_name(array.dtype)), varying)


def mesh_spec(mesh: dict[str, int]) -> isa.MeshSpec:
    return isa.MeshSpec(tuple(mesh), tuple(mesh.values()))


def value_info(shape: tuple[int, ...], dtype: str, varying) -> isa.ValueInfo:
    """A value of per-chip `shape` and type `dtype` varying along mesh axes `varying`."""
    return isa.ValueInfo(isa.TensorType(tuple(shape), dtype), frozenset(varying))


def kernel_call(make: Callable[[tuple, tuple], isa.Instruction], args: Sequence[np.ndarray],
                outs: Sequence[tuple[tuple[int, ...], str, frozenset]],
                mesh: dict[str, int], rounding: Callable | None = None
                ) -> tuple[isa.Instruction, KernelContext]:
    """The instruction `make(outs, ins)` over `args` and the context a kernel sees it in, as
    run_kernel runs it (for helpers of kernels that take the context)."""
    spec = mesh_spec(mesh)
    ins = tuple(range(len(args)))
    out_ids = tuple(range(len(args), len(args) + len(outs)))
    values = {i: info_of(np.asarray(a), spec.rank) for i, a in zip(ins, args)}
    values.update({o: value_info(*out) for o, out in zip(out_ids, outs)})
    instr = make(out_ids, ins)
    program = isa.Program(spec, (instr,), ins, out_ids, values)
    run = lambda sub, sub_args, reached=None: run_program(sub, sub_args, rounding, reached)
    return instr, KernelContext(program, run=run, rounding=rounding)


def run_kernel(make: Callable[[tuple, tuple], isa.Instruction], args: Sequence[np.ndarray],
               outs: Sequence[tuple[tuple[int, ...], str, frozenset]],
               mesh: dict[str, int], rounding: Callable | None = None) -> list[np.ndarray]:
    """The kernel of `make(outs, ins)` on `args` (arrays with a leading dim per mesh axis);
    `outs` gives each result's (per-chip shape, dtype name, mesh axes it varies along)."""
    instr, ctx = kernel_call(make, args, outs, mesh, rounding)
    with jax.enable_x64(True):  # as the executor runs, 64-bit values keeping their type
        arrays = [jnp.asarray(a) for a in args]  # as the executor holds them
        return [np.asarray(r) for r in kernel_for(instr)(instr, arrays, ctx)]


def sub_program(mesh: dict[str, int], instructions: Sequence[isa.Instruction],
                inputs: Sequence[int], outputs: Sequence[int],
                values: dict[int, tuple[tuple[int, ...], str, frozenset]]) -> isa.Program:
    """A loop body, branch or reducer over `mesh`: `values` gives each value's (per-chip
    shape, dtype name, mesh axes it varies along), as run_kernel's `outs` do."""
    return isa.Program(mesh_spec(mesh), tuple(instructions), tuple(inputs), tuple(outputs),
                       {v: value_info(*info) for v, info in values.items()})


def bits(x: np.ndarray) -> np.ndarray:
    """x's bit patterns, for bit-exact comparisons of floats (-0.0 and NaNs included)."""
    x = np.asarray(x)
    return x.view(np.dtype(f"uint{8 * x.dtype.itemsize}"))
