"""The mapping pass: every dot onto Tensor Engine tiles, every collective onto torus links.

Runs once the machine is known (the topology, and where the mesh's devices sit on it).
Matmuls get their `tiling` (mesh.perf.tensor_engine) and a `pass_size` equal to the tiling's
contraction pass, so the executor accumulates PSUM passes exactly as the tiles do;
collectives get their `plan` (mesh.perf.collectives). Sub-programs (loop bodies, branches)
are planned the same way. The result is the program the executor runs.
"""

from __future__ import annotations

import dataclasses

from mesh import isa
from mesh.perf import tensor_engine
from mesh.perf.collectives import KINDS, plan_collective
from mesh.machine import Placement, Topology


def plan_program(program: isa.Program, topology: Topology,
                 placement: Placement | None) -> isa.Program:
    """`program` with its matmuls tiled and its collectives planned for `topology`."""
    planned = tuple(_plan(instr, program, topology, placement)
                    for instr in program.instructions)
    return dataclasses.replace(program, instructions=planned)


def _plan(instr: isa.Instruction, program: isa.Program, topology: Topology,
          placement: Placement | None) -> isa.Instruction:
    if isinstance(instr, isa.Matmul):
        lhs, rhs = (program.values[v].type for v in instr.ins)
        batch, m, n, k = tensor_engine.matmul_shape(instr, lhs, rhs)
        tiling = tensor_engine.tile_matmul(batch, m, n, k, lhs.dtype, rhs.dtype,
                                           instr.out_dtype, topology.device)
        return dataclasses.replace(instr, tiling=tiling, pass_size=tiling.k_pass)
    if isinstance(instr, isa.RaggedMatmul):
        lhs, rhs, sizes = (program.values[v].type for v in instr.ins)
        batch, m, n, k = tensor_engine.ragged_matmul_shape(instr, lhs, rhs, sizes)
        tiling = tensor_engine.tile_matmul(batch, m, n, k, lhs.dtype, rhs.dtype,
                                           instr.out_dtype, topology.device)
        return dataclasses.replace(instr, tiling=tiling, pass_size=tiling.k_pass)
    if type(instr) in KINDS:
        moved = instr.outs if isinstance(instr, isa.AllGather) else \
            instr.ins[:1] if isinstance(instr, isa.RaggedAllToAll) else instr.ins
        message = sum(program.values[v].type.nbytes for v in moved)
        return dataclasses.replace(instr, plan=plan_collective(instr, message, topology,
                                                               placement))
    return isa.map_subprograms(instr, lambda p: plan_program(p, topology, placement))
