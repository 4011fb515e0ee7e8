"""Collectives that only part of a group reaches.

Where control flow differs from chip to chip (a loop whose trip count, or a conditional
whose branch, depends on the chip), the executor runs a body for every chip and keeps each
chip's own results (mesh.isa.kernels.control_flow). A collective in such a body that some
members of a group reach and others do not is not defined by StableHLO; on Trainium2 the
members that reached it would wait for the others forever (XLA:CPU hangs the same way).
The executor checks each such collective every time it runs, and the run ends with a
SplitCollectiveError naming it, rather than with numbers no machine would produce.
"""

from __future__ import annotations

import threading
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import isa


class SplitCollectiveError(RuntimeError):
    """A collective was reached by some members of a group and not by the others."""


def meeting_groups(instr: isa.Instruction) -> np.ndarray | None:
    """The logical device ids that must reach `instr` together, one row per group (a
    permute's source and target as a pair); None when `instr` is not a collective."""
    if isinstance(instr, isa.CollectivePermute):
        return np.asarray(instr.pairs, np.int64).reshape(-1, 2)
    groups = getattr(instr, "groups", None)
    return None if groups is None else np.asarray(groups.device_groups, np.int64)


class SplitGroupCheck:
    """The checks of one compiled program: traced into it by `check`, they report at run
    time; `raise_if_split` after a run raises for the first split collective it met."""

    def __init__(self) -> None:
        self.armed = False  # whether the program has any check (else runs need no wait)
        self._found: list[str] = []
        # held around a run and its raise_if_split (when armed), so that each run of the
        # program, from whichever thread or executable, reports its own
        self.lock = threading.Lock()

    def check(self, instr: isa.Instruction, groups: np.ndarray, reached: jnp.ndarray,
              mesh: isa.MeshSpec) -> None:
        """Trace a check of `instr`'s groups against `reached` ([mesh...] bool, size 1
        along axes it does not vary on): which chips' control flow gets to it."""
        self.armed = True
        members = jnp.broadcast_to(reached, tuple(mesh.axis_sizes)).reshape(-1)[groups]
        split = jnp.any(members, axis=1) & ~jnp.all(members, axis=1)
        # the host hears of it only when a group is split (not at every loop iteration)
        lax.cond(jnp.any(split), lambda m: jax.debug.callback(
            partial(self._record, instr, groups), m), lambda m: None, members)

    def _record(self, instr: isa.Instruction, groups: np.ndarray, members) -> None:
        members = np.asarray(members)
        split = members.any(axis=1) & ~members.all(axis=1)
        if self._found:
            return
        g = int(np.argmax(split))
        came = groups[g][members[g]].tolist()
        missing = groups[g][~members[g]].tolist()
        self._found.append(
            f"{instr.mnemonic} at {instr.loc or 'unknown location'}: logical devices {came} of the "
            f"group {groups[g].tolist()} reached it and {missing} did not (a loop ran a "
            "different number of times, or a conditional took another branch, on them). On "
            "Trainium2 the chips that reached it would wait for the others forever "
            "(StableHLO leaves it undefined): keep the members of each group on the same "
            "path through the program.")

    def raise_if_split(self) -> None:
        if self._found:
            message = self._found[0]
            self._found.clear()
            raise SplitCollectiveError(message)
