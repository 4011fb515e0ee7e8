"""XLA's C++ log while it partitions a program, with its warnings said the Python way.

XLA writes its log (absl logging) straight to file descriptor 2, not through Python, so
lowering.partition sends that descriptor through a pipe around its compile
(`captured_stderr`): a thread passes every line on to stderr as it comes, but for the
partitioner's "Involuntary full rematerialization" warnings, which it holds back for
`report` to say once as a Python warning that says what they cost and where to look. The
lines go on at once, not after the compile, so that when XLA aborts the process (a failed
check) its message still reaches the console, under a line that says what was running.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import warnings
from typing import Iterator, Sequence

STDERR_FD = 2
# spmd_partitioner.cc: "[SPMD] Involuntary full rematerialization. The compiler cannot go
# from sharding {A} to {B} efficiently for HLO operation %name = type[shape]{layout} ..."
FULL_REMATERIALIZATION = re.compile(
    r"Involuntary full rematerialization\. The compiler cannot go from sharding (.+?) to "
    r"(.+?) efficiently for HLO operation (%\S+) = (\w+\[[\d,]*\])")
# absl's fatal log line, which XLA writes just before it aborts: "F1204 08:05:16.807997 ..."
FATAL = re.compile(rb"^F\d{4} ")
FATAL_PREFACE = (b"jax-trn2: XLA aborted the process while it compiled a program for the "
                 b"simulator (XLA's SPMD partitioner and XLA:CPU's passes, "
                 b"lowering.partition); XLA's message:\n")
_REPORTED: set[str] = set()  # the values warned about, once per process


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Pass what is written to file descriptor 2 inside the block on to stderr line by
    line, but for the full-rematerialization warnings: yields a list that holds those
    (for `report`) once the block ends."""
    held: list[str] = []
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    saved = os.dup(STDERR_FD)
    forwarder = threading.Thread(target=_forward, args=(read_end, saved, held),
                                 name="jax-trn2 XLA log", daemon=True)
    forwarder.start()
    os.dup2(write_end, STDERR_FD)
    os.close(write_end)
    try:
        yield held
    finally:
        sys.stderr.flush()
        os.dup2(saved, STDERR_FD)  # the pipe's last write end closes: the forwarder ends
        forwarder.join()
        os.close(saved)


def _forward(read_end: int, stderr: int, held: list[str]) -> None:
    """Copy lines from `read_end` to `stderr` until the pipe closes, holding back the
    rematerialization warnings in `held`; a fatal line gets FATAL_PREFACE first."""
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                _pass_on(line, stderr, held)
    if pending:
        _pass_on(pending, stderr, held)


def _pass_on(line: bytes, stderr: int, held: list[str]) -> None:
    text = line.decode("utf-8", errors="replace")
    if FULL_REMATERIALIZATION.search(text):
        held.append(text)
        return
    os.write(stderr, (FATAL_PREFACE if FATAL.match(line) else b"") + line + b"\n")


def _avoidable(match: re.Match | None) -> re.Match | None:
    """A rematerialization warning's match, unless its target sharding is one device's."""
    if match is None or match.group(2).startswith("{maximal"):
        return None
    return match


def report(lines: Sequence[str]) -> None:
    """Warn once about the values XLA's partitioner rematerialized in full (once per
    process for the same values); write every other line back to stderr, among them those
    about a value gathered to one device (`{maximal device=N}`): a host callback's operand
    (jax.debug.print, pure_callback), which jax gathers by design and no sharding avoids."""
    found = [(line, _avoidable(FULL_REMATERIALIZATION.search(line))) for line in lines]
    others = [line for line, match in found if match is None]
    if others:
        sys.stderr.write("\n".join(others) + "\n")
    rematerialized = [match for _, match in found if match is not None]
    if not rematerialized:
        return
    values = "; ".join(f"{m.group(4)} ({m.group(3)}) from {m.group(1)} to {m.group(2)}"
                       for m in rematerialized)
    if values in _REPORTED:  # the same program partitioned again (by CPU JAX, say)
        return
    _REPORTED.add(values)
    warnings.warn(
        f"XLA's SPMD partitioner found no efficient way to reshard {len(rematerialized)} "
        "value(s) of this program (its 'Involuntary full rematerialization' warning, which "
        "jax.jit on real devices gives too): it makes each whole on every chip and slices it "
        "again, an all-gather of the full value with room for it in every chip's HBM. The "
        "listing shows the collectives the partitioner inserted, with the source line of "
        "each; sharding the value as the ops that use it want it (with_sharding_constraint, "
        f"the in_shardings) avoids them. The values: {values}", stacklevel=3)
