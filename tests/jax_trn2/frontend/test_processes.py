"""One simulation over the executor devices of several processes (jax.distributed on
localhost, gloo CPU collectives): global jax arrays in and out, bit-identical to one
process; a process that dies gives the others an error naming it."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.jax_trn2.plugin.test_distributed import free_port

# Jobs of several jax.distributed processes run one at a time (one xdist worker): on two
# cores, two jobs at once (up to 6 processes starting jax) pushed a job past its time bound.
pytestmark = pytest.mark.xdist_group("jax_distributed")

REPO = Path(__file__).resolve().parents[3]
DEVICES = 4  # executor devices of the job, split evenly over its processes

START = textwrap.dedent("""
    import sys
    import jax
    process_id, port, processes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_num_cpu_devices", {devices} // processes)
    jax.config.update("jax_enable_recoverability", {recoverable})  # a lost process: an error
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{{port}}",
                               num_processes=processes, process_id=process_id,
                               initialization_timeout=60, heartbeat_timeout_seconds=3)
    import hashlib, os
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding, PartitionSpec as P
    import jax_trn2

    def digest(tree):  # of the global values (gathered from every process), or local ones
        h = hashlib.sha256()
        for leaf in jax.tree.leaves(tree):
            value = np.asarray(leaf if leaf.is_fully_addressable else
                               multihost_utils.process_allgather(leaf, tiled=True))
            h.update(str((value.dtype, value.shape)).encode() + value.tobytes())
        return h.hexdigest()

    def check_global(tree):  # each process holds its own devices' shards, only those
        for leaf in jax.tree.leaves(tree) if processes > 1 else ():
            assert not leaf.is_fully_addressable, leaf.sharding
            assert leaf.sharding.device_set == set(jax.devices()), leaf.sharding
            assert {{s.device for s in leaf.addressable_shards}} <= set(jax.local_devices())
""")

# (recoverability off: jax's shutdown then waits for every process, where the first one,
# which holds the job's service, would otherwise leave before the others have shut down)
PROGRAMS = START.format(devices=DEVICES, recoverable=False) + textwrap.dedent("""
    # a shard_map program: matmul, ring reductions, gathers and scatters
    mesh = jax_trn2.make_mesh((4, 4, 4), ("x", "y", "z"))

    def body(x, w):
        h = jnp.tanh(jnp.dot(x, w, preferred_element_type=jnp.float32))
        return (jax.lax.psum(h, "y"), jax.lax.all_gather(h.astype(jnp.bfloat16), "z", tiled=True),
                jax.lax.psum_scatter(h, "x", tiled=True), jax.lax.pmax(jnp.sum(h), ("x", "y", "z")))

    f = jax.shard_map(body, mesh=mesh, in_specs=(P(("x", "z"), "y"), P("y", None)),
                      out_specs=(P(("x", "z")), P("x"), P("x"), P()), check_vma=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 512)).astype(jnp.bfloat16)
    w = rng.standard_normal((512, 256)).astype(jnp.bfloat16)
    spread = jax_trn2.jit(f, executor_devices=jax.devices())(x, w)
    check_global(spread)
    print("shard_map", digest(spread), digest(jax_trn2.jit(f)(x, w)), flush=True)

    # an auto-partitioned training step (NamedShardings, no shard_map), three steps, the
    # parameters passed back as the global arrays a step returned
    mesh = jax_trn2.make_mesh((8, 8), ("data", "model"))

    def loss(params, x, y):
        h = jax.nn.relu(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    weights = {"w1": NamedSharding(mesh, P(None, "model")),
               "w2": NamedSharding(mesh, P("model", None))}
    batch = NamedSharding(mesh, P("data"))
    train = jax_trn2.jit(step, in_shardings=(weights, batch, batch),
                         out_shardings=(weights, NamedSharding(mesh, P())),
                         executor_devices=jax.devices())
    params = {"w1": rng.standard_normal((64, 128)).astype(np.float32),
              "w2": rng.standard_normal((128, 16)).astype(np.float32)}
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.standard_normal((64, 16)).astype(np.float32)
    losses = []
    for _ in range(3):
        params, value = train(params, x, y)
        losses.append(value)
    check_global((params, losses))
    if processes > 1:  # a global array of another layout goes in as well (jax moves it)
        x = jax.make_array_from_callback(x.shape, NamedSharding(
            jax.make_mesh((len(jax.devices()),), ("d",), devices=jax.devices()),
            P(None, "d")), lambda index: x[index])
    params, value = train(params, x, y)
    print("training", digest((params, losses, value)), flush=True)
    jax.distributed.shutdown()  # (together: the first process holds the job's service)
""")

DIES = START.format(devices=DEVICES, recoverable=True) + textwrap.dedent("""
    import time
    mesh = jax_trn2.make_mesh((4, 4, 4), ("x", "y", "z"))
    f = jax_trn2.jit(jax.shard_map(lambda a: jax.lax.psum(a * 2, "x"), mesh=mesh,
                                   in_specs=P("x", "y"), out_specs=P(None, "y")),
                     executor_devices=jax.devices())
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    jax.block_until_ready(f(a))
    multihost_utils.sync_global_devices("ran once")
    if process_id == processes - 1:
        os._exit(3)  # dies between two steps: the others' next run meets it gone
    time.sleep(0.5)
    started = time.monotonic()
    try:
        f(a)
    except jax_trn2.ProcessLostError as e:
        print(f"after {time.monotonic() - started:.0f} s:", e, flush=True)
    os._exit(0)
""")


def run_job(script: str, processes: int, timeout: float = 120) -> list[tuple[int, str, str]]:
    """Each process's (return code, stdout, stderr) of `script` run as a job of
    `processes` processes on localhost."""
    port = str(free_port())
    workers = [subprocess.Popen([sys.executable, "-c", script, str(i), port, str(processes)],
                                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for i in range(processes)]
    try:
        outputs = [w.communicate(timeout=timeout) for w in workers]
    finally:
        for w in workers:
            w.kill()
    return [(w.returncode, out, err) for w, (out, err) in zip(workers, outputs)]


def digests(processes: int) -> dict[str, list[str]]:
    """Each line's digests from every process of a job running PROGRAMS (all alike)."""
    results = run_job(PROGRAMS, processes)
    lines = []
    for code, out, err in results:
        assert code == 0, err[-3000:]
        lines.append([line for line in out.splitlines()
                      if line.startswith(("shard_map", "training"))])  # (not gloo's)
    assert all(other == lines[0] for other in lines), lines
    return {line.split()[0]: line.split()[1:] for line in lines[0]}


@pytest.fixture(scope="module")
def one_process() -> dict[str, list[str]]:
    return digests(1)


@pytest.mark.parametrize("processes", [2, 4])
def test_a_simulation_over_several_processes_gives_the_bits_of_one(processes, one_process):
    spread = digests(processes)
    assert spread == one_process
    # over the devices of several processes as on one device
    over_devices, on_one_device = spread["shard_map"]
    assert over_devices == on_one_device


def test_a_process_that_dies_is_named_by_the_others():
    results = run_job(DIES, 2)  # the job's bound includes two processes' start-up
    code, out, err = results[0]
    assert code == 0, err[-3000:]
    assert "process [1] of the jax.distributed job stopped" in out, out + err[-3000:]
    assert results[1][0] == 3
    # the survivor's error came within a few heartbeats (3 s each), not after a hang
    waited = float(re.search(r"after (\d+) s:", out).group(1))
    assert waited <= 30, out
