"""Algebraic simplifications of a lowered program, as a compiler for the chip would make.

- transpose(dot(a, b)) that only swaps the two operands' free dims is dot(b, a): the Tensor
  Engine writes its result in either orientation (the stationary operand picks it), so the
  transpose costs nothing on the chip, and the executor skips a copy of the whole result.
- Instructions whose results nobody reads are removed (for example the device-id
  arithmetic that lowering already folded to constants), unless they have side effects
  (host callbacks such as jax.debug.print, in loops and conditionals too).
"""

from __future__ import annotations

import collections
import dataclasses

from mesh import isa


def simplify(program: isa.Program) -> isa.Program:
    """`program` with transposed matmuls folded (sub-programs are simplified too)."""
    uses = collections.Counter(v for instr in program.instructions for v in instr.ins)
    uses.update(program.outputs)
    producer = {v: instr for instr in program.instructions for v in instr.outs}
    replaced: dict[int, isa.Matmul] = {}  # id of a folded matmul -> the swapped matmul
    kept = []
    for instr in program.instructions:
        matmul = _folds_into(instr, program, producer, uses)
        if matmul is None:
            kept.append(isa.map_subprograms(instr, simplify))
        else:
            replaced[id(matmul)] = _swapped(matmul, instr.outs)
    instructions = [replaced.get(id(instr), instr) for instr in kept]
    return dataclasses.replace(program, instructions=_live(instructions, program.outputs))


def _live(instructions: list[isa.Instruction], outputs) -> tuple[isa.Instruction, ...]:
    """The instructions some output depends on, and those with side effects (and what
    they read), in their order."""
    needed = set(outputs)
    live = []
    for instr in reversed(instructions):
        if needed.intersection(instr.outs) or isa.has_side_effects(instr):
            live.append(instr)
            needed.update(instr.ins)
    return tuple(reversed(live))


def _folds_into(instr, program: isa.Program, producer, uses) -> isa.Matmul | None:
    """The matmul a transpose folds into: its only use, transposed by swapping free dims."""
    if not isinstance(instr, isa.Transpose):
        return None
    (source,) = instr.ins
    matmul = producer.get(source)
    if not isinstance(matmul, isa.Matmul) or uses[source] != 1:
        return None
    lhs_rank, rhs_rank = (program.values[v].type.rank for v in matmul.ins)
    nb = len(matmul.lhs_batch)
    nl = lhs_rank - nb - len(matmul.lhs_contract)
    nr = rhs_rank - nb - len(matmul.rhs_contract)
    swap = (tuple(range(nb)) + tuple(range(nb + nl, nb + nl + nr))
            + tuple(range(nb, nb + nl)))
    return matmul if instr.permutation == swap else None


def _swapped(matmul: isa.Matmul, outs: tuple[int, ...]) -> isa.Matmul:
    """dot(b, a) writing the transpose's result."""
    return dataclasses.replace(
        matmul, outs=outs, ins=matmul.ins[::-1], lhs_batch=matmul.rhs_batch,
        rhs_batch=matmul.lhs_batch, lhs_contract=matmul.rhs_contract,
        rhs_contract=matmul.lhs_contract)
