"""The text listing of a Trn2 program: one line per instruction."""

from __future__ import annotations

import numpy as np

from mesh import isa


def value_text(program: isa.Program, value: int) -> str:
    """`%7:bfloat16[4,8]{x,y}`: id, per-chip type and the mesh axes it varies along."""
    info = program.values[value]
    axes = ",".join(program.mesh.axis_names[a] for a in sorted(info.varying))
    return f"%{value}:{info.type}" + (f"{{{axes}}}" if axes else "")


def params_text(instr: isa.Instruction) -> str:
    parts = []
    for name, value in instr.params().items():
        if isinstance(value, np.ndarray):
            value = f"<{value.dtype}{list(value.shape)}>" if value.size > 8 else value.tolist()
        elif isinstance(value, isa.Groups):
            value = _groups_text(value)
        elif isinstance(value, isa.Program):
            value = f"<{value.name}: {len(value.instructions)} instructions>"
        elif name == "pairs" and len(value) > 8:
            value = f"<{len(value)} pairs>"
        parts.append(f"{name}={value}")
    return " ".join(parts)


def _groups_text(groups: isa.Groups) -> str:
    if groups.axes is not None:
        return f"axes{list(groups.axes)}"
    return f"<{len(groups.device_groups)} groups of {groups.group_size}>"


def instruction_text(program: isa.Program, instr: isa.Instruction) -> str:
    outs = ", ".join(value_text(program, v) for v in instr.outs)
    ins = ", ".join(f"%{v}" for v in instr.ins)
    params = params_text(instr)
    loc = f"  # {instr.loc}" if instr.loc else ""
    return f"{outs} = {instr.engine}.{instr.mnemonic}({ins}){' ' + params if params else ''}{loc}"


def program_text(program: isa.Program) -> str:
    """The whole program: a header with the mesh, inputs, instructions, outputs."""
    lines = [f"trn2.program @{program.name} mesh={program.mesh} "
             f"({program.mesh.num_devices} chips)"]
    lines.append("  inputs: " + ", ".join(value_text(program, v) for v in program.inputs))
    lines += ["  " + instruction_text(program, i) for i in program.instructions]
    lines.append("  outputs: " + ", ".join(value_text(program, v) for v in program.outputs))
    return "\n".join(lines)
