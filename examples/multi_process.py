"""One simulation of 64 Trainium2 chips over the processes of a jax.distributed job.

    python examples/multi_process.py            # starts 2 processes on this machine
    python examples/multi_process.py 0 2 HOST:PORT   # on several hosts: each its own id

Every process runs the same program with the same arguments, through both doors:
jax_trn2.jit with executor_devices=jax.devices() splits the simulated chips over the job's
devices (each process computes its block) and gives back a global jax.Array, of which each
process holds its devices' shards; plain jax.jit on a mesh of jax.devices("trn2"), whose
devices the plugin splits over the processes, runs the same way, each process passing and
getting back its own devices' shards.
"""

from __future__ import annotations

import socket
import subprocess
import sys


def run(process_id: int, num_processes: int, coordinator: str) -> None:
    """This process's part of the job: print its index and the whole result's sum."""
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_trn2

    mesh = jax_trn2.make_mesh((4, 4, 4), ("x", "y", "z"))  # 64 simulated chips
    f = jax.shard_map(lambda a: jax.lax.psum(a, "y"), mesh=mesh,
                      in_specs=P("x", "y"), out_specs=P("x"))
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)  # the same in every process
    out = jax_trn2.jit(f, executor_devices=jax.devices())(a)  # a global jax.Array
    rows = sorted({s.index[0].start or 0 for s in out.addressable_shards})
    total = multihost_utils.process_allgather(out, tiled=True).sum()

    # the plugin's door: the trn2 devices, split over the processes (jax.local_devices)
    trn2 = jax.make_mesh((4, 16), ("x", "y"), devices=jax.devices("trn2"))
    g = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "y"), mesh=trn2,
                              in_specs=P("x", "y"), out_specs=P("x")))
    shards = jax.device_put(a, NamedSharding(trn2, P("x", "y")))  # this process's pieces
    plugin_total = multihost_utils.process_allgather(g(shards), tiled=True).sum()
    print(f"process {jax.process_index()}: holds rows from {rows[0]}, jax.jit on trn2: sum "
          f"{plugin_total:.6g}, jax_trn2.jit: sum {total:.6g}")


def free_port() -> int:
    """A TCP port of this machine that nothing listens on now, for the coordinator."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(num_processes: int = 2) -> list[str]:
    """Start the job's processes on this machine; the line each prints last (gloo prints
    its own before), in process order."""
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([sys.executable, __file__, str(i), str(num_processes),
                               coordinator], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
             for i in range(num_processes)]
    outputs = [p.communicate(timeout=300) for p in procs]
    for i, (p, (_, err)) in enumerate(zip(procs, outputs)):
        if p.returncode:
            raise RuntimeError(f"process {i} exited with {p.returncode}:\n{err}")
    return [out.strip().splitlines()[-1] for out, _ in outputs]


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    else:
        print("\n".join(launch()))
