"""Plain jax.jit on trn2 devices of several jax.distributed processes (2 on localhost, gloo
CPU collectives): each process passes and gets its own devices' shards, the bits those of
one process; a process that dies gives the others an error naming it."""

import re
import textwrap
from collections import defaultdict

import pytest

from tests.jax_trn2.frontend.test_processes import START, run_job

# Jobs of several jax.distributed processes run one at a time (one xdist worker): on two
# cores, two jobs at once (up to 6 processes starting jax) pushed a job past its time bound.
pytestmark = pytest.mark.xdist_group("jax_distributed")

# the 8 devices of a trn2.3xlarge at LNC=1: 4 a process over 2
MACHINE = 'import os\nos.environ.update(JAX_TRN2_TOPOLOGY="trn2.3xlarge", JAX_TRN2_LNC="1")\n'

SETUP = textwrap.dedent("""
    from jax.sharding import AxisType
    trn2 = jax.devices("trn2")
    mesh = jax.make_mesh((2, 4), ("x", "y"), devices=trn2, axis_types=(AxisType.Auto,) * 2)

    def show(name, tree):  # this process's shards of each leaf: device, index, bits
        for n, leaf in enumerate(jax.tree.leaves(tree)):
            assert leaf.sharding.device_set == set(trn2), leaf.sharding
            for shard in leaf.addressable_shards:
                value = np.asarray(shard.data)
                bits = hashlib.sha256(str((value.dtype, value.shape)).encode() + value.tobytes())
                print(name, n, shard.device.id, str(shard.index).replace(" ", ""), bits.hexdigest(),
                      flush=True)

    def rows(sharding, array):  # this process's rows of `array` (its devices hold a block)
        starts = sorted({(i[0].start or 0, i[0].stop or len(array)) for i in
                         sharding.addressable_devices_indices_map(array.shape).values()})
        return np.concatenate([array[a:b] for a, b in starts])
""")

PROGRAMS = MACHINE + START.format(devices=4, recoverable=False) + SETUP + textwrap.dedent("""
    # a shard_map program: matmul, ring reductions, gathers and scatters
    def body(x, w):
        h = jnp.tanh(jnp.dot(x, w, preferred_element_type=jnp.float32))
        return (jax.lax.psum(h, "y"), jax.lax.all_gather(h.astype(jnp.bfloat16), "x", tiled=True),
                jax.lax.psum_scatter(h, "y", tiled=True), jax.lax.pmax(jnp.sum(h), ("x", "y")))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P("y", None)),
                              out_specs=(P("x"), P(None, "y"), P(("x", "y")), P()),
                              check_vma=False))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 128)).astype(jnp.bfloat16)
    w = rng.standard_normal((128, 32)).astype(jnp.bfloat16)
    xs = jax.device_put(x, NamedSharding(mesh, P("x", "y")))  # the same host array in each
    ws = jax.make_array_from_callback(w.shape, NamedSharding(mesh, P("y", None)),
                                      lambda index: w[index])  # each process's shards
    out = f(xs, ws)
    show("shard_map", out)
    gathered = multihost_utils.process_allgather(out[0], tiled=True)  # a trn2 program too
    print("gathered", hashlib.sha256(gathered.tobytes()).hexdigest(), flush=True)

    # an auto-partitioned training step (NamedShardings, a grad), three steps, the
    # parameters passed back as the global arrays a step returned
    mesh = jax.make_mesh((2, 4), ("data", "model"), devices=trn2,
                         axis_types=(AxisType.Auto,) * 2)

    def loss(params, x, y):
        h = jax.nn.relu(x @ params["w1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    weights = {"w1": NamedSharding(mesh, P(None, "model")),
               "w2": NamedSharding(mesh, P("model", None))}
    batch = NamedSharding(mesh, P("data"))
    train = jax.jit(step, in_shardings=(weights, batch, batch),
                    out_shardings=(weights, NamedSharding(mesh, P())))
    params = jax.device_put({"w1": rng.standard_normal((64, 128)).astype(np.float32),
                             "w2": rng.standard_normal((128, 16)).astype(np.float32)}, weights)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    y = rng.standard_normal((64, 16)).astype(np.float32)
    x, y = (jax.make_array_from_process_local_data(batch, rows(batch, a)) for a in (x, y))
    losses = []
    for _ in range(3):
        params, value = train(params, x, y)
        losses.append(value)
    show("training", (params, losses))
    jax.distributed.shutdown()  # (together: the first process holds the job's service)
""")

DIES = MACHINE + START.format(devices=4, recoverable=True) + SETUP + textwrap.dedent("""
    import time
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a * 2, "x"), mesh=mesh,
                              in_specs=P("x", "y"), out_specs=P(None, "y")))
    a = jax.device_put(np.arange(64 * 64, dtype=np.float32).reshape(64, 64),
                       NamedSharding(mesh, P("x", "y")))
    jax.block_until_ready(f(a))
    multihost_utils.sync_global_devices("ran once")
    if process_id == processes - 1:
        os._exit(3)  # dies between two steps: the others' next run meets it gone
    time.sleep(0.5)
    started = time.monotonic()
    try:
        jax.block_until_ready(f(a))
    except Exception as e:
        print(f"after {time.monotonic() - started:.0f} s:", type(e).__name__, e, flush=True)
    os._exit(0)
""")


HELD = MACHINE + START.format(devices=4, recoverable=False) + SETUP + textwrap.dedent("""
    import gc
    def resident():  # this process's resident memory (bytes)
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    blocks = NamedSharding(mesh, P("x", "y"))
    shape = (4096, 8192)  # 128 MiB of FP32 whole, 64 MiB of it on each process's devices
    def arange(index):  # a block of the global value, made where it is put
        rows, cols = (range(*s.indices(n)) for s, n in zip(index, shape))
        return (np.arange(rows.start, rows.stop, dtype=np.float32)[:, None] * shape[1]
                + np.arange(cols.start, cols.stop, dtype=np.float32))
    f = jax.jit(lambda a: a * 2 + 1, out_shardings=blocks)
    jax.block_until_ready(f(jax.make_array_from_callback(shape, blocks, arange)))  # compiles
    gc.collect()
    x = jax.make_array_from_callback(shape, blocks, arange)  # this process's shards alone
    before = resident()
    y = jax.block_until_ready(f(x))
    print("held", resident() - before, 4 * shape[0] * shape[1], flush=True)
    print("devices", *sorted(s.device.id for s in y.addressable_shards), flush=True)
    whole = multihost_utils.process_allgather(y, tiled=True)
    expected = arange((slice(None), slice(None))) * 2 + 1
    print("equal", whole.dtype == expected.dtype and np.array_equal(whole, expected), flush=True)

    # a mesh whose rows each hold devices of both processes: a process's devices lack the
    # part its chips read, so the argument's pieces move first, and the result is whole
    mixed = jax.make_mesh((2, 4), ("x", "y"), devices=[trn2[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)],
                          axis_types=(AxisType.Auto,) * 2)
    blocks = NamedSharding(mixed, P("x", "y"))
    a = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    z = jax.jit(lambda a: a * 2 + 1, out_shardings=blocks)(jax.device_put(a, blocks))
    print("mixed", np.array_equal(multihost_utils.process_allgather(z, tiled=True), a * 2 + 1),
          flush=True)
    jax.distributed.shutdown()
""")


def shards(processes: int) -> dict[str, set[tuple[str, ...]]]:
    """Per program, the (leaf, device, index, bits) of every shard the processes of a job
    running PROGRAMS hold, each process holding its own devices' alone; and the gathered
    value's digest."""
    found: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for process, (code, out, err) in enumerate(run_job(PROGRAMS, processes, timeout=60)):
        assert code == 0, err[-3000:]
        lines = [line.split() for line in out.splitlines()
                 if line.startswith(("shard_map", "training", "gathered"))]  # (not gloo's)
        own = set(range(8 // processes * process, 8 // processes * (process + 1)))
        for name, *fields in lines:
            if name != "gathered":
                assert int(fields[1]) in own, (process, fields)
            found[name].add(tuple(fields))
    return found


@pytest.fixture(scope="module")
def one_process() -> dict[str, set[tuple[str, ...]]]:
    return shards(1)


def test_jax_jit_over_the_devices_of_two_processes_gives_the_bits_of_one(one_process):
    spread = shards(2)
    assert spread == one_process
    assert len(spread["gathered"]) == 1  # the same whole value in every process
    assert len(spread["shard_map"]) == 4 * 8 and len(spread["training"]) == 5 * 8


def test_a_process_that_dies_is_named_by_the_others():
    results = run_job(DIES, 2, timeout=60)  # the job's bound includes two processes' start-up
    code, out, err = results[0]
    assert code == 0, err[-3000:]
    assert "process [1] of the jax.distributed job stopped" in out, out + err[-3000:]
    assert results[1][0] == 3
    # the survivor's error came within a few heartbeats (3 s each), not after a hang
    waited = float(re.search(r"after (\d+) s:", out).group(1))
    assert waited <= 30, out


def test_each_process_holds_only_its_own_devices_pieces_of_a_result():
    """Neither the result nor the argument is made whole on any process: what a call
    leaves a process holding (its resident memory after, less before) is its own devices'
    half of the result (before: the whole result, gathered to every process)."""
    for process, (code, out, err) in enumerate(run_job(HELD, 2, timeout=120)):
        assert code == 0, err[-3000:]
        found = {line.split()[0]: line.split()[1:] for line in out.splitlines()
                 if line.startswith(("held", "devices", "equal", "mixed"))}
        held, whole = map(int, found["held"])
        print(f"process {process} holds {held / 2**20:.0f} MiB more after the call; "
              f"the whole result is {whole / 2**20:.0f} MiB")
        assert held <= whole * 3 // 4, (process, held, whole)  # its half, and some slack
        assert found["devices"] == [str(d) for d in range(4 * process, 4 * process + 4)]
        assert found["equal"] == found["mixed"] == ["True"]
