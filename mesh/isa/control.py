"""Control flow of the Trn2 instruction set: loops and conditionals over sub-programs.

A sub-program here runs on the same mesh as the program holding it (unlike the scalar
reducer bodies of `isa.Reduce`): its values have layouts, and it may contain collectives.
Its inputs are the op's own operands (loop-carried values; none for a conditional's
branches) followed by `captured`: values of the enclosing program that the regions use.
The instruction's `ins` are laid out the same way, so the executor passes them straight on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mesh.isa import NONE, Instruction, Program


@dataclass(frozen=True, eq=False)
class ControlFlow(Instruction):
    """An instruction that runs sub-programs over the whole mesh."""

    engine: ClassVar[str] = NONE  # the sequencer; the sub-programs' instructions do the work

    def regions(self) -> tuple[tuple[str, Program], ...]:
        """(label, sub-program) pairs, in the order the listing shows them."""
        raise NotImplementedError


@dataclass(frozen=True, eq=False)
class While(ControlFlow):
    """stablehlo.while: `state = ins[:n]; while cond(state): state = body(state)`.

    ins = (*initial state, *captured); outs = the final state (n values). `cond` returns one
    bool per chip; where it differs from chip to chip (its output varies along some mesh
    axes), the loop runs while any chip's condition holds and a chip whose condition is false
    keeps its state unchanged. `trip_count` is the number of iterations when the loop
    counts a constant start to a constant bound by a constant step (a fori_loop or scan),
    else None; the cost model multiplies the body's cost by it.
    """

    cond: Program
    body: Program
    trip_count: int | None

    def regions(self) -> tuple[tuple[str, Program], ...]:
        times = f" x{self.trip_count}" if self.trip_count is not None else ""
        return (("cond", self.cond), (f"body{times}", self.body))


@dataclass(frozen=True, eq=False)
class Case(ControlFlow):
    """stablehlo.case / stablehlo.if: run `branches[index]` and return its results.

    ins = (index, *captured). An int32 index out of [0, len(branches)) selects the last
    branch (the StableHLO spec); a bool index (stablehlo.if) selects branch 0 when true and
    branch 1 when false. Where the index differs from chip to chip, every branch runs on the
    whole mesh and each chip keeps the results of its own branch.
    """

    branches: tuple[Program, ...]

    def regions(self) -> tuple[tuple[str, Program], ...]:
        return tuple((p.name, p) for p in self.branches)


@dataclass(frozen=True, eq=False)
class Composite(ControlFlow):
    """stablehlo.composite: the op `name` (a name the program's authors gave a group of ops,
    with its `attributes` and `version`), run as its decomposition; ins = its operands."""

    name: str
    version: int
    attributes: str
    decomposition: Program

    def regions(self) -> tuple[tuple[str, Program], ...]:
        return ((f"{self.name} = {self.decomposition.name}", self.decomposition),)


@dataclass(frozen=True, eq=False)
class Scan(ControlFlow):
    """chlo.scan: `body` run on each position along `dimension` of the `num_inputs` inputs
    in turn (from the last when `is_reverse`), carrying values from one to the next.

    ins = (*inputs, *initial carries, *captured), `num_inputs` and `num_carries` of the
    first two; `body` takes (the inputs' slices at the position, *carries, *captured) and
    gives (the outputs' slices at the position, *new carries); outs = (*outputs, *final
    carries). `trip_count` is the length along `dimension`.
    """

    dimension: int
    is_reverse: bool
    num_inputs: int
    num_carries: int
    body: Program
    trip_count: int

    def regions(self) -> tuple[tuple[str, Program], ...]:
        return ((f"body x{self.trip_count}", self.body),)
