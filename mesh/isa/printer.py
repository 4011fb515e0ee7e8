"""The text listing of a Trn2 program: one line per instruction."""

from __future__ import annotations

from typing import Callable

import numpy as np

from mesh import isa
from mesh.isa import control as isa_control
from mesh.isa.sites import site_text


def value_text(program: isa.Program, value: int) -> str:
    """`%7:bfloat16[4,8]{x,y}`: id, per-chip type and the mesh axes it varies along."""
    info = program.values[value]
    axes = ",".join(program.mesh.axis_names[a] for a in sorted(info.varying))
    return f"%{value}:{info.type}" + (f"{{{axes}}}" if axes else "")


def params_text(instr: isa.Instruction) -> str:
    parts = []
    in_mnemonic = ("op", "direction") if isinstance(instr, isa.Elementwise) else ()
    for name, value in instr.params().items():
        empty = value is None or (isinstance(value, str) and not value)
        if isinstance(value, isa.Plan) or name in in_mnemonic or empty:
            continue  # plans are shown on lines of their own (plan_lines)
        if isinstance(value, np.ndarray):
            value = f"<{value.dtype}{list(value.shape)}>" if value.size > 8 else value.tolist()
        elif isinstance(value, isa.Groups):
            value = _groups_text(value)
        elif isinstance(value, isa.Program):
            value = f"<{value.name}: {len(value.instructions)} instructions>"
        elif isinstance(value, tuple) and value and isinstance(value[0], isa.Program):
            value = f"<{len(value)} programs>"
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
    site = site_text(instr)
    loc = f"  # {site}" if site else ""
    assigned = f"{outs} = " if outs else ""  # an instruction run for its side effect only
    return (f"{assigned}{instr.engine}.{instr.mnemonic}({ins})"
            f"{' ' + params if params else ''}{loc}")


def plan_lines(instr: isa.Instruction, indent: str) -> list[str]:
    """Why the instruction is there when the user did not write it, and how the hardware
    runs it (tiling, torus plan), indented under it."""
    return ([indent + instr.why] if instr.why else []) + \
        [indent + line for value in instr.params().values() if isinstance(value, isa.Plan)
         for line in value.describe().splitlines()]


def _region_lines(instr: isa.Instruction, indent: str, prefix, pad: str) -> list[str]:
    """The sub-programs of a loop or conditional, indented under it: `body x4(%inputs):`,
    their instructions (each after `prefix(sub, i)` when given), and `yield %outputs`."""
    if not isinstance(instr, isa_control.ControlFlow):
        return []
    lines = []
    for label, sub in instr.regions():
        lines.append(f"{pad}{indent}{label}({', '.join(value_text(sub, v) for v in sub.inputs)}):")
        for i, inner in enumerate(sub.instructions):
            lines.append((prefix(sub, i) if prefix else pad) + f"{indent}  "
                         + instruction_text(sub, inner))
            lines += plan_lines(inner, pad + indent + "      ")
            lines += _region_lines(inner, indent + "    ", prefix, pad)
        lines.append(f"{pad}{indent}  yield " + ", ".join(f"%{v}" for v in sub.outputs))
    return lines


def program_text(program: isa.Program,
                 prefix: Callable[[isa.Program, int], str] | None = None) -> str:
    """The whole program: a header with the mesh, inputs, instructions, outputs.

    `prefix(p, i)` (e.g. estimated times) starts the line of instruction i of program `p`
    (`program` or one of its loop bodies and branches); other lines are padded to line up."""
    width = len(prefix(program, 0)) if prefix and program.instructions else 0
    pad = " " * width
    lines = [f"trn2.program @{program.name} mesh={program.mesh} "
             f"({program.mesh.num_devices} devices)"]
    lines.append(pad + "  inputs: " + ", ".join(value_text(program, v) for v in program.inputs))
    for i, instr in enumerate(program.instructions):
        lines.append((prefix(program, i) if prefix else "") + "  " + instruction_text(program, instr))
        lines += plan_lines(instr, pad + "      ")
        lines += _region_lines(instr, "    ", prefix, pad)
    lines.append(pad + "  outputs: " + ", ".join(value_text(program, v) for v in program.outputs))
    return "\n".join(lines)
