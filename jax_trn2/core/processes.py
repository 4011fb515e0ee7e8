"""The processes of a jax.distributed job that a simulation runs over, and which of them
are gone when a run fails.

A run over the executor devices of several processes (jax_trn2.jit's executor_devices, or
the trn2 plugin's program over several processes' devices) is one XLA computation in each,
joined by jax's cross-process collectives (gloo or MPI on CPUs); the plugin also moves
with them, between the processes, the pieces of an argument whose parts some process's
devices lack (stacked_over_processes). When a process dies, the others' collectives fail
(gloo: the peer's connection is reset) or wait on it; jax's coordination service declares
it dead once it has missed its heartbeats for `heartbeat_timeout_seconds`
(jax.distributed.initialize's; 100 by default).
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from jax._src import distributed
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# How long a failed run waits for the coordination service's verdict on the other
# processes (s): jax's default heartbeat timeout (100 s), with a margin.
LIVENESS_WAIT_S = 120


# The status codes of a failed run's errors: jaxlib raises most as JaxRuntimeError, some (a
# gloo collective whose peer is gone, in a computation jax dispatches from its C++ path) as
# ValueError, with the same "CODE: message" text.
_RUNTIME_STATUS = re.compile(r"(UNKNOWN|INTERNAL|UNAVAILABLE|ABORTED|CANCELLED|"
                             r"DEADLINE_EXCEEDED|FAILED_PRECONDITION|DATA_LOSS): ")


class ProcessLostError(RuntimeError):
    """A process of the jax.distributed job stopped while a simulation ran over its
    devices (jax_trn2.jit's executor_devices, or a trn2 program over several processes'
    devices: jax raises it there as its own error type, with this message)."""


def runtime_failure(error: BaseException) -> bool:
    """Whether `error` is a failure of a running computation (jaxlib's), which a process
    that stopped causes in the others, rather than one of their arguments or programs."""
    return isinstance(error, jax.errors.JaxRuntimeError) or (
        isinstance(error, ValueError) and _RUNTIME_STATUS.match(str(error)) is not None)


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


# How long a run over several processes may wait on its results before the survivors ask
# the coordination service whether a process stopped (s): a collective whose peer died
# does not always fail (gloo can wait on it for ever), so a long wait is checked.
SUSPECT_AFTER_S = 10.0
_POLL_S = 0.05  # how often the waiting run looks at its results (s)


def wait_for_run(results: Sequence[jax.Array], process_ids: Iterable[int]) -> list[int]:
    """Wait until `results` (a run's outputs, dispatched) are computed, and return [];
    or, if the run is still waiting after SUSPECT_AFTER_S seconds and jax's coordination
    service then holds some of `process_ids` dead, return them (the run's collectives
    wait on them, and may never end). Every surviving process of the run asks alike."""
    arrays = [r for r in jax.tree.leaves(results) if isinstance(r, jax.Array)]
    started, verdict = time.monotonic(), {}
    asking = None
    while not all(a.is_ready() for a in arrays):
        if asking is None and time.monotonic() - started > SUSPECT_AFTER_S:
            def ask():  # the service answers once it knows every process's state
                verdict["lost"] = lost_processes(process_ids) or []
            asking = threading.Thread(target=ask, name="jax_trn2-run-watch", daemon=True)
            asking.start()
        if verdict.get("lost"):
            return verdict["lost"]
        time.sleep(_POLL_S)
    return []


def stacked_over_processes(local: np.ndarray, devices: Sequence[jax.Device]) -> np.ndarray:
    """Every process's `local` (the same shape and dtype in each), stacked in process
    order, in every process: moved by jax's cross-process collectives over `devices` (the
    devices of every process of the job, as many of each; gloo or MPI on CPUs). Every
    process calls it, in the same order as its other collectives."""
    by_process: dict[int, list[jax.Device]] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    mesh = Mesh(np.array([by_process[p] for p in sorted(by_process)]), ("process", "local"))
    rows = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("process")), local[None])
    return replicated([rows])[0]


def replicated(arrays: Sequence[jax.Array]) -> list[np.ndarray]:
    """Global arrays over the devices of several processes (NamedShardings), each whole on
    the host of every process (jax's collectives gather them)."""
    shardings = [NamedSharding(a.sharding.mesh, PartitionSpec()) for a in arrays]
    whole = jax.jit(_identity, out_shardings=shardings)(list(arrays))
    return [np.asarray(a.addressable_data(0)) for a in whole]


def _identity(x: Any) -> Any:  # (one function: jax compiles the gather once per signature)
    return x
