"""Per-chip HBM use of a program: jax's memory-analysis figures, the peak and what fills it.

    analysis = MemoryAnalysis(program, chip_spec, device_to_chip, num_chips, times)
    analysis.stats()          # the chip with the highest peak (jax's field names)
    analysis.stats(chip=5)    # any chip of the topology
    analysis.over_capacity()  # chips whose peak exceeds their HBM
    analysis.summary()        # text for listings and the CLI

The liveness model is mesh.memory.liveness's. Every chip of the program's mesh runs the same
program on the same per-chip types, so they hold the same bytes; chips of the topology the
mesh does not use hold nothing of it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from mesh import isa
from mesh.isa.sites import line_text
from mesh.machine.chip import GIB, ChipSpec
from mesh.memory.liveness import (ARGUMENT, INSIDE, OUTPUT, TEMPORARY, Buffer, Liveness,
                                  PeakSplit, liveness)
from mesh.units import bytes_text

LISTED_AT_PEAK = 5  # buffers the summary and the out-of-HBM message name


class OutOfHBMError(RuntimeError):
    """A program needs more HBM on some chip than the chip has (jax's RESOURCE_EXHAUSTED).

    `stats` is the fullest chip's MemoryStats, `chips` the chip ids over capacity."""

    def __init__(self, message: str, stats: "MemoryStats", chips: tuple[int, ...]):
        super().__init__(message)
        self.stats = stats
        self.chips = chips


@dataclass(frozen=True)
class MemoryStats:
    """One chip's HBM use over one step, with the field names of jax's CompiledMemoryStats.

    All sizes are bytes on that chip. `argument_size_in_bytes` and `output_size_in_bytes`
    are the chip's pieces of the arguments and outputs; `alias_size_in_bytes` the outputs
    written into donated arguments; `temp_size_in_bytes` the most bytes of intermediate
    buffers live at once; `peak_memory_in_bytes` the most bytes live at once of everything.
    `generated_code_size_in_bytes` is 0: instruction streams are not modelled.
    `peak_split` (not jax's) is what holds the peak at its instant: donated arguments, other
    arguments, outputs and temporaries, summing to `peak_memory_in_bytes`.
    The `host_*` fields are the same figures for buffers in the host's memory (jax's
    pinned_host and unpinned_host memory kinds, offloaded values), which the HBM figures
    leave out; `host_generated_code_size_in_bytes` is 0.
    """

    chip: int
    argument_size_in_bytes: int
    output_size_in_bytes: int
    alias_size_in_bytes: int
    temp_size_in_bytes: int
    generated_code_size_in_bytes: int
    peak_memory_in_bytes: int
    hbm_bytes: int  # the chip's capacity
    peak_split: PeakSplit = PeakSplit()
    live_at_peak: tuple[Buffer, ...] = dataclasses.field(default=(), repr=False)  # largest first
    host_argument_size_in_bytes: int = 0
    host_output_size_in_bytes: int = 0
    host_alias_size_in_bytes: int = 0
    host_temp_size_in_bytes: int = 0
    host_generated_code_size_in_bytes: int = 0

    @property
    def fits(self) -> bool:
        return self.peak_memory_in_bytes <= self.hbm_bytes


def bytes_bound(program: isa.Program) -> int:
    """An upper bound on what one chip holds in HBM at any time running `program`: every
    value of it and of its sub-programs at its full type (a global value stored whole),
    all live at once, plus a copy of every output (liveness's buffers are these values and
    output copies, each at most its type's bytes). It needs no schedule: a program under it
    fits however it runs."""
    total = sum(program.values[v].type.nbytes for v in program.outputs)
    programs = [program]
    while programs:
        current = programs.pop()
        total += sum(info.type.nbytes for info in current.values.values())
        for instr in current.instructions:
            for subprograms in isa.subprogram_fields(instr).values():
                programs.extend(subprograms)
    return total


class MemoryAnalysis:
    """HBM use on every chip of a topology running `program`.

    `device_to_chip[d]` is the chip of logical device d (None: a program without a mesh
    runs on chip 0); `times[i]` the (start, end) of instruction i in seconds (a schedule;
    program order when None); `input_names` name the program's inputs in messages."""

    def __init__(self, program: isa.Program, chip: ChipSpec,
                 device_to_chip: Sequence[int] | None = None, num_chips: int = 1,
                 times: Sequence[tuple[float, float]] | None = None,
                 input_names: Sequence[str] | None = None):
        self.program = program
        self.chip = chip
        self.running_chips = tuple(sorted(device_to_chip)) if device_to_chip is not None \
            else (0,)
        self.num_chips = max(num_chips, max(self.running_chips) + 1)
        self.liveness: Liveness = liveness(program, times, input_names)

    def _bytes_by_memory(self, values: Sequence[int], types: Sequence[isa.TensorType],
                         host: Sequence[int], positions: Sequence[int]) -> tuple[int, int]:
        """(bytes in HBM, bytes in host memory) of the inputs or outputs at `positions`
        (`values` with their stored `types`), `host` those held in host memory."""
        in_host = [values[k] in host for k in positions]
        nbytes = [types[k].nbytes for k in positions]
        return (sum(n for n, h in zip(nbytes, in_host) if not h),
                sum(n for n, h in zip(nbytes, in_host) if h))

    @cached_property
    def _running(self) -> MemoryStats:
        """The stats every chip running the program shares (chip field: the first)."""
        live, program = self.liveness, self.program
        inputs = self._bytes_by_memory(program.inputs, live.input_types,
                                       program.host_inputs(), range(len(program.inputs)))
        outputs = self._bytes_by_memory(program.outputs, live.output_types,
                                        program.host_outputs(), range(len(program.outputs)))
        # the outputs written into donated arguments (lowering pairs them as XLA does)
        aliased = self._bytes_by_memory(program.outputs, live.output_types,
                                        program.host_outputs(),
                                        [target for _, target in program.donated_inputs])
        return MemoryStats(
            chip=self.running_chips[0],
            argument_size_in_bytes=inputs[0],
            output_size_in_bytes=outputs[0],
            alias_size_in_bytes=aliased[0],
            temp_size_in_bytes=live.peak_of((TEMPORARY, INSIDE)),
            generated_code_size_in_bytes=0,
            peak_memory_in_bytes=live.peak_bytes,
            hbm_bytes=self.chip.hbm_bytes,
            peak_split=live.peak_split,
            live_at_peak=live.live_at_peak,
            host_argument_size_in_bytes=inputs[1],
            host_output_size_in_bytes=outputs[1],
            host_alias_size_in_bytes=aliased[1],
            host_temp_size_in_bytes=live.host_peak_of((TEMPORARY,)))

    def stats(self, chip: int | None = None) -> MemoryStats:
        """The stats of chip `chip` (a chip id of the topology), or of the chip with the
        highest peak (the lowest id among equals) when None."""
        if chip is None:
            return self._running
        if not 0 <= chip < self.num_chips:
            raise ValueError(f"chip {chip} is not a chip of the topology (0..{self.num_chips - 1})")
        if chip in self.running_chips:
            return _with_chip(self._running, chip)
        return MemoryStats(chip, 0, 0, 0, 0, 0, 0, self.chip.hbm_bytes)

    def per_chip(self) -> dict[int, MemoryStats]:
        """Every chip's stats, by chip id."""
        return {c: self.stats(c) for c in range(self.num_chips)}

    def over_capacity(self) -> tuple[int, ...]:
        """The chips whose peak exceeds their HBM."""
        return () if self._running.fits else self.running_chips

    def summary(self) -> str:
        """The peak per chip, its parts, and the largest buffers live at the peak."""
        s = self._running
        share = s.peak_memory_in_bytes / s.hbm_bytes
        idle = self.num_chips - len(self.running_chips)
        where = (f"on each of the {len(self.running_chips)} chips running the program"
                 if len(self.running_chips) > 1 else "on the chip running the program") + \
            (f" (the other {idle} hold none of it)" if idle else "")
        verdict = "fits" if s.fits else "DOES NOT FIT"
        lines = [
            f"HBM per chip: peak {bytes_text(s.peak_memory_in_bytes)} of "
            f"{bytes_text(s.hbm_bytes)} ({share:.1%}, {verdict}) {where}",
            f"  arguments {bytes_text(s.argument_size_in_bytes)}, outputs "
            f"{bytes_text(s.output_size_in_bytes)} (aliased to donated arguments "
            f"{bytes_text(s.alias_size_in_bytes)}), temporaries at most "
            f"{bytes_text(s.temp_size_in_bytes)}",
            f"  at the peak: {peak_split_text(s.peak_split)}",
        ]
        host = (s.host_argument_size_in_bytes, s.host_output_size_in_bytes,
                s.host_temp_size_in_bytes)
        if any(host):
            lines.append(f"  in host memory (not in HBM): arguments {bytes_text(host[0])}, "
                         f"outputs {bytes_text(host[1])}, temporaries at most "
                         f"{bytes_text(host[2])}")
        if s.live_at_peak:
            lines.append(f"  live at the peak ({len(s.live_at_peak)} buffers):")
            lines += ["    " + describe(b) for b in s.live_at_peak[:LISTED_AT_PEAK]]
            rest = s.live_at_peak[LISTED_AT_PEAK:]
            if rest:
                lines.append(f"    ... {len(rest)} more, {bytes_text(sum(b.nbytes for b in rest))}")
        return "\n".join(lines)

    def check(self) -> None:
        """Raise OutOfHBMError when some chip's peak exceeds its HBM."""
        if self.over_capacity():
            raise OutOfHBMError(self.out_of_hbm_message(), self._running, self.over_capacity())

    def out_of_hbm_message(self) -> str:
        """Why the program does not fit: which chips, peak vs capacity, what is live."""
        s = self._running
        chips = self.over_capacity()
        peak, capacity = _gib_pair(s.peak_memory_in_bytes, s.hbm_bytes)
        return (f"out of HBM: the program needs {peak} of HBM per chip at its peak, more "
                f"than the {capacity} of a {self.chip.name} "
                f"(on {_chips_text(chips)}); largest buffers live at the peak: "
                + "; ".join(describe(b) for b in s.live_at_peak[:LISTED_AT_PEAK]))


def peak_split_text(split: PeakSplit) -> str:
    """'donated arguments 4.00 GiB + other arguments 16.00 MiB + outputs 0 B + temporaries
    1.50 GiB'."""
    return " + ".join(f"{name} {bytes_text(n)}" for name, n in (
        ("donated arguments", split.donated_arguments),
        ("other arguments", split.other_arguments), ("outputs", split.outputs),
        ("temporaries", split.temporaries)))


def describe(buffer: Buffer) -> str:
    """`float32[40000,160000] (23.84 GiB) temporary from model.py:88 (dot_general)`."""
    if buffer.kind == INSIDE:
        inner = ", ".join(str(b.type) if b.type is not None else f"{b.what} {bytes_text(b.nbytes)}"
                          for b in buffer.inner[:3])  # a nested loop's own needs
        return (f"{bytes_text(buffer.nbytes)} inside the {buffer.what}"
                + (f" ({inner}{', ...' if len(buffer.inner) > 3 else ''})" if inner else "")
                + _from(buffer.loc))
    if buffer.kind == ARGUMENT:
        role = f"{buffer.what}{' (donated)' if buffer.donated else ''}"
    else:
        role = f"{'output' if buffer.kind == OUTPUT else 'temporary'} ({buffer.what})"
    return f"{buffer.type} ({bytes_text(buffer.nbytes)}) {role}{_from(buffer.loc)}"


def _from(loc: str) -> str:
    """` from model.py:88`: the short path and line of a `path:line:col` location."""
    return f" from {line_text(loc)}" if loc else ""


def _gib_pair(peak: int, capacity: int) -> tuple[str, str]:
    """Peak and capacity in GiB, or in the unit that suits a chip of less than 1 GiB (a
    topology with its HBM overridden), where GiB would read 0.00."""
    if capacity >= GIB:
        return f"{peak / GIB:.2f} GiB", f"{capacity / GIB:.2f} GiB"
    return bytes_text(peak), bytes_text(capacity)


def _chips_text(chips: Sequence[int]) -> str:
    chips = sorted(chips)
    if len(chips) > 1 and chips == list(range(chips[0], chips[-1] + 1)):
        return f"chips {chips[0]}-{chips[-1]}"
    return ("chip " if len(chips) == 1 else "chips ") + ", ".join(map(str, chips))


def _with_chip(stats: MemoryStats, chip: int) -> MemoryStats:
    return dataclasses.replace(stats, chip=chip)
