"""Lowering a tiny program and picking out what one rule emitted: shared by the
tests of lowering/rules (each test file is one rule family)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

import lowering
from mesh import isa
from mesh.executor import run_program


def lower_jax(fn: Callable[..., Any], *args: Any,
              host_callbacks: Sequence[Any] | None = None) -> isa.Program:
    """The Trn2 program of jax.jit(fn) at these arguments."""
    return lowering.lower(jax.jit(fn).lower(*args).compiler_ir("stablehlo"),
                          host_callbacks=host_callbacks)


def lower_text(body: str, host_callbacks: Sequence[Any] | None = None) -> isa.Program:
    """The Trn2 program of a module holding this StableHLO text (its functions)."""
    return lowering.lower(f"module @m {{\n{body}\n}}", host_callbacks=host_callbacks)


def run(program: isa.Program, *args: np.ndarray) -> list[np.ndarray]:
    """The outputs of a program without a mesh (one chip), run by the simulator's kernels:
    for rules that expand an op into several instructions, whose result is what to check."""
    return [np.asarray(out) for out in run_program(program, args)]


def only(program: isa.Program, kind: type) -> Any:
    """The one instruction of this class in the program (top level), failing otherwise."""
    found = [i for i in program.instructions if isinstance(i, kind)]
    assert len(found) == 1, [type(i).__name__ for i in program.instructions]
    return found[0]


def out_type(program: isa.Program, instruction: isa.Instruction) -> isa.TensorType:
    """The type of an instruction's first result."""
    return program.info(instruction.outs[0]).type
