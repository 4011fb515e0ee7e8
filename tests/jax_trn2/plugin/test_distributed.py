"""The plugin under jax.distributed: two and four processes on localhost, with the plugin
installed (jax starts its backend in each), run a CPU program, split the simulated devices
and run a program over the devices of every process."""

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jax_trn2.core.options import client_options

# Jobs of several jax.distributed processes run one at a time (one xdist worker): on two
# cores, two jobs at once (up to 6 processes starting jax) pushed a job past its time bound.
pytestmark = pytest.mark.xdist_group("jax_distributed")

REPO = Path(__file__).resolve().parents[3]

WORKER = textwrap.dedent("""
    import sys
    import jax
    process_id, port, processes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes,
                               process_id=process_id, initialization_timeout=120)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    print("cpu sum", float(jax.jit(lambda v: v.sum())(jnp.ones(8))))
    trn2, local = jax.devices("trn2"), jax.local_devices(backend="trn2")
    print("devices", len(trn2), "local", len(local), "owners",
          sorted({d.process_index for d in local}))
    x = jax.device_put(np.arange(4.0, dtype=np.float32), local[0])
    print("local program", np.asarray(jax.jit(lambda v: v * 2)(x)).tolist())
    mesh = jax.make_mesh((len(trn2),), ("d",), devices=trn2)
    whole = NamedSharding(mesh, P())
    y = jax.jit(lambda v: v + 1, in_shardings=whole, out_shardings=whole)(np.arange(4.0))
    print("spanning program", sorted({d.process_index for d in y.sharding.device_set}),
          [np.asarray(s.data).tolist() for s in y.addressable_shards][0])
    first = NamedSharding(jax.make_mesh((4,), ("d",), devices=trn2[:4]), P("d"))  # process 0's
    z = jax.jit(lambda v: v * 3)(jax.make_array_from_callback(
        (4,), first, lambda index: np.arange(4.0, dtype=np.float32)[index], dtype=np.float32))
    print("process 0's program", [np.asarray(s.data).tolist() for s in z.addressable_shards])
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_run_cpu_programs_and_own_a_share_of_the_devices_each(processes):
    port = str(free_port())
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), port, str(processes)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
               for i in range(processes)]
    try:
        outputs = [w.communicate(timeout=300) for w in workers]
    finally:
        for w in workers:
            w.kill()
    for i, (worker, (out, err)) in enumerate(zip(workers, outputs)):
        assert worker.returncode == 0, err[-3000:]
        lines = [line for line in out.splitlines() if not line.startswith("[Gloo]")]
        assert lines[0] == "cpu sum 8.0"
        assert lines[1] == f"devices 64 local {64 // processes} owners [{i}]"
        assert lines[2] == "local program [0.0, 2.0, 4.0, 6.0]"
        assert lines[3] == f"spanning program {list(range(processes))} [1.0, 2.0, 3.0, 4.0]"
        # every process calls it; the others, with none of its devices, get no shards
        assert lines[4] == "process 0's program " + (
            "[[0.0], [3.0], [6.0], [9.0]]" if i == 0 else "[]")


def test_devices_are_split_in_blocks_of_consecutive_ids():
    options = client_options({"node_id": 2, "num_nodes": 3, "topology": "trn2"})
    assert [options.process_of(i) for i in range(16)] == [0] * 6 + [1] * 5 + [2] * 5
    with pytest.raises(ValueError, match="node_id 3 is not one of the job's 3 processes"):
        client_options({"node_id": 3, "num_nodes": 3})
    with pytest.raises(ValueError, match="17 processes .* 16 devices of trn2"):
        client_options({"node_id": 0, "num_nodes": 17, "topology": "trn2"})
