"""XLA's C++ log while it partitions a program, kept off the user's console.

XLA writes its log (absl logging) straight to file descriptor 2, not through Python, so
lowering.partition captures that descriptor around its compile (`captured_stderr`) and
`report` re-reports what matters: the partitioner's "Involuntary full rematerialization"
warnings as one Python warning that says what they cost and where to look; any other line
goes back to stderr as it was.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from typing import Iterator, Sequence

STDERR_FD = 2
# spmd_partitioner.cc: "[SPMD] Involuntary full rematerialization. The compiler cannot go
# from sharding {A} to {B} efficiently for HLO operation %name = type[shape]{layout} ..."
FULL_REMATERIALIZATION = re.compile(
    r"Involuntary full rematerialization\. The compiler cannot go from sharding (.+?) to "
    r"(.+?) efficiently for HLO operation (%\S+) = (\w+\[[\d,]*\])")
_REPORTED: set[str] = set()  # the values warned about, once per process


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Send what is written to file descriptor 2 inside the block to a temporary file;
    yields a list that holds its lines once the block ends."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(STDERR_FD)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), STDERR_FD)
        try:
            yield lines
        finally:
            sys.stderr.flush()
            os.dup2(saved, STDERR_FD)
            os.close(saved)
            log.seek(0)
            lines.extend(log.read().decode("utf-8", errors="replace").splitlines())


def report(lines: Sequence[str]) -> None:
    """Warn once about the values XLA's partitioner rematerialized in full (once per
    process for the same values); write every other line back to stderr."""
    found = [(line, FULL_REMATERIALIZATION.search(line)) for line in lines]
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
