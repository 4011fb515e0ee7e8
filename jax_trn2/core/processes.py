"""The processes of a jax.distributed job that a simulation runs over, and which of them
are gone when a run fails.

A run over the executor devices of several processes (jax_trn2.jit's executor_devices)
is one XLA computation in each, joined by jax's cross-process collectives (gloo or MPI on
CPUs). When a process dies, the others' collectives fail (gloo: the peer's connection is
reset) or wait on it; jax's coordination service declares it dead once it has missed its
heartbeats for `heartbeat_timeout_seconds` (jax.distributed.initialize's; 100 by default).
"""

from __future__ import annotations

import threading
from typing import Iterable

from jax._src import distributed

# How long a failed run waits for the coordination service's verdict on the other
# processes (s): jax's default heartbeat timeout (100 s), with a margin.
LIVENESS_WAIT_S = 120


class ProcessLostError(RuntimeError):
    """A process of the jax.distributed job stopped while a simulation ran over its
    devices (jax_trn2.jit's executor_devices)."""


def lost_processes(process_ids: Iterable[int],
                   wait_s: float = LIVENESS_WAIT_S) -> list[int] | None:
    """The processes of `process_ids` that jax's coordination service holds dead, once
    it knows (after their heartbeat timeout): None if that is not known within `wait_s`
    seconds, or the job has no coordination service. The survivors of a failed run each
    ask (the service answers them together)."""
    client = distributed.global_state.client
    if client is None:
        return None
    ids = sorted(set(process_ids))
    answer: dict[str, dict] = {}

    def ask():  # blocks until the service has a verdict on every process asked about
        try:
            answer["live"] = client.get_live_nodes(ids)
        except Exception:  # the service itself failed: nothing to tell
            pass

    asking = threading.Thread(target=ask, name="jax_trn2-liveness", daemon=True)
    asking.start()
    asking.join(wait_s)
    if "live" not in answer:
        return None
    return [i for i in ids if i not in answer["live"]]
