"""One simulation over several JAX devices: bit-identical to one device.

The host devices must be configured before JAX starts, so each case runs in a subprocess
with jax_num_cpu_devices set.
"""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

SCRIPT = """
import jax
jax.config.update("jax_num_cpu_devices", {devices})
import jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
import jax_trn2

mesh = jax_trn2.make_mesh((4, 4, 4), ("x", "y", "z"))

def body(x, w):  # BF16 matmul with FP32 PSUM, ring reductions, gathers and scatters
    h = jnp.tanh(jnp.dot(x, w, preferred_element_type=jnp.float32))
    return (jax.lax.psum(h, "y"), jax.lax.all_gather(h.astype(jnp.bfloat16), "z", tiled=True),
            jax.lax.psum_scatter(h, "x", tiled=True), jax.lax.pmax(jnp.sum(h), ("x", "y", "z")))

f = jax.shard_map(body, mesh=mesh, in_specs=(P(("x", "z"), "y"), P("y", None)),
                  out_specs=(P(("x", "z")), P("x"), P("x"), P()), check_vma=False)
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 512)).astype(jnp.bfloat16)
w = rng.standard_normal((512, 256)).astype(jnp.bfloat16)
one = jax_trn2.jit(f)(x, w)
split = jax_trn2.jit(f, executor_devices=jax.devices())
many = split(x, w)
run = split.lower(x, w).compile().executable._run_global.compiled  # what a call runs
used = {{d for s in run.input_shardings[0] for d in s.device_set}}
assert len(used) == {devices}, used
for a, b in zip(one, many):
    a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
    assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))
print("bit-identical over", len(used), "devices")

# By default the simulation runs on a CPU client of its own with one device (XLA:CPU runs
# kernels faster there than on this client of several), and results come back laid out on
# the mesh as jax.jit lays them out: by the shard_map's out_specs, committed.
default_run = jax_trn2.jit(f).lower(x, w).compile().executable._run_global.compiled
(own,) = {{d for s in default_run.input_shardings[0] for d in s.device_set}}
assert own not in jax.devices() and own.client.device_count() == 1, own
assert [r.sharding.spec for r in one] == [P(("x", "z")), P("x"), P("x"), P()], one
assert all(r.committed and r.sharding.mesh == mesh for r in one)
# One named device: the simulation runs there.
last = jax.devices()[-1]
pinned = jax_trn2.jit(f, executor_devices=[last])
run = pinned.lower(x, w).compile().executable._run_global.compiled
assert {{d for s in run.input_shardings[0] for d in s.device_set}} == {{last}}
for a, b in zip(one, pinned(x, w)):
    assert np.array_equal(np.atleast_1d(np.asarray(a)).view(np.uint8),
                          np.atleast_1d(np.asarray(b)).view(np.uint8))
print("pinned to", last)
# Under a transformation the call is evaluated on the executor devices it was given too
# (jax_trn2.frontend.compose makes a jax_trn2.jit function of the transformed one: it is told them).
import sys
jit_module = sys.modules["jax_trn2.frontend.jit"]  # the module of the function jax_trn2.jit
square_grad = jax_trn2.jit(jax.grad(lambda x: jnp.sum(x * x)), executor_devices=[last])
given = []
class Recording(jit_module.Jitted):
    def __init__(self, *args, **kwargs):
        given.append(kwargs.get("executor_devices"))
        super().__init__(*args, **kwargs)
jit_module.Jitted = Recording
batched = jax.vmap(square_grad)(np.ones((2, 3), np.float32))
assert np.array_equal(np.asarray(batched), np.full((2, 3), 2, np.float32))
assert given[-1] == (last,), given
print("transformed on", last)
"""


@pytest.mark.parametrize("devices", [2, 4])
def test_simulation_over_several_devices_is_bit_identical(devices):
    result = subprocess.run([sys.executable, "-c", SCRIPT.format(devices=devices)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"bit-identical over {devices} devices" in result.stdout
    assert "pinned to" in result.stdout
    assert "transformed on" in result.stdout


NATIVE_SCRIPT = """
import jax
jax.config.update("jax_num_cpu_devices", 4)
import re
import jax.numpy as jnp, numpy as np
from jax.sharding import PartitionSpec as P
import jax_trn2

mesh = jax_trn2.make_mesh((4, 4, 4), ("x", "y", "z"))
rng = np.random.default_rng(0)

def dot(x, w):
    return jnp.dot(x, w, preferred_element_type=jnp.float32)

def batched(x, w):
    return jnp.einsum("bmk,bkn->bmn", x, w, preferred_element_type=jnp.float32)

def native_result(jitted, x, w):  # the shape of the native loop's result on a device
    text = jitted.lower(x, w).compile().executable._run_global.compiled.as_text()
    (shape,) = set(re.findall(r"= f32\\[([\\d,]+)\\][^\\n]*jax_trn2_pass_matmul", text))
    return tuple(map(int, shape.split(",")))

# operands split along x: the left one only, both (a batch), the left along x and the
# right along y; K of several passes
cases = [(dot, (P("x"), P()), P("x"), (32, 512), (512, 40)),
         (batched, (P("x"), P("x")), P("x"), (4, 8, 512), (4, 512, 40)),
         (dot, (P("x"), P(None, "y")), P("x", "y"), (32, 300), (300, 40))]
for dtype in (jnp.bfloat16, jnp.float32):
    for body, in_specs, out_specs, x_shape, w_shape in cases:
        f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal(w_shape).astype(dtype)
        one, split = jax_trn2.jit(f), jax_trn2.jit(f, executor_devices=jax.devices())
        assert np.array_equal(np.asarray(one(x, w)).view(np.uint8),
                              np.asarray(split(x, w)).view(np.uint8))
        # each device computes a quarter of the mesh's x axis (of the executor layout's
        # first dim), not all of it; one device computes it all (written in that layout,
        # or straight into the unsharded result: as many elements)
        whole, quarter = native_result(one, x, w), native_result(split, x, w)
        assert quarter[0] == 1 and np.prod(whole) == 4 * np.prod(quarter)
print("native matmuls split")
"""


def test_native_matmuls_are_split_over_the_devices():
    result = subprocess.run([sys.executable, "-c", NATIVE_SCRIPT], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "native matmuls split" in result.stdout


UNDIVIDED_SCRIPT = """
import jax
jax.config.update("jax_num_cpu_devices", 3)
import jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import jax_trn2

# 3 devices divide no axis of the (8,) mesh, but the arguments' dim of 48: the simulation
# is replicated over them, each computing whole chips (not the GEMM's contraction split
# three ways, which sums in another order)
mesh = jax_trn2.make_mesh((8,), ("d",), topology="trn2")
rows, whole = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
a = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
f = lambda x, y: (x @ y.T).sum(axis=0)
one = jax_trn2.jit(f, in_shardings=(rows, whole), out_shardings=rows)(a, a[:16])
three = jax_trn2.jit(f, in_shardings=(rows, whole), out_shardings=rows,
                     executor_devices=jax.devices())(a, a[:16])
assert np.array_equal(np.asarray(one).view(np.uint8), np.asarray(three).view(np.uint8))
print("bit-identical over 3 devices")
"""


def test_devices_that_divide_no_mesh_axis_compute_whole_chips():
    result = subprocess.run([sys.executable, "-c", UNDIVIDED_SCRIPT], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bit-identical over 3 devices" in result.stdout


@pytest.mark.parametrize("chip_shape", [(32, 32), (1, 1024), (2, 32, 32), (3, 1000)])
def test_a_chip_sums_in_the_same_order_however_many_chips_a_device_holds(chip_shape):
    """Each chip of an (8,) mesh sums its own values over all but its first dim; over 4 or
    8 executor devices a device holds 1 or 2 chips, over 1 device all 8. XLA:CPU's own
    reduce sums in another order where it keeps 1 or 2 rows than 4 or more: the simulator's
    reduce orders the sum itself."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import jax_trn2

    mesh = jax_trn2.make_mesh((8,), ("x",))
    dims = tuple(range(1, len(chip_shape)))
    f = jax.shard_map(lambda a: jnp.sum(a, axis=dims), mesh=mesh, in_specs=P("x"),
                      out_specs=P("x"))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8 * chip_shape[0],) + chip_shape[1:]).astype(np.float32)
    one = np.asarray(jax_trn2.jit(f, executor_devices=jax.devices()[:1])(x))
    for devices in (2, 4, 8):
        split = np.asarray(jax_trn2.jit(f, executor_devices=jax.devices()[:devices])(x))
        assert np.array_equal(split.view(np.uint32), one.view(np.uint32)), devices


@pytest.mark.parametrize("name", ["softmax", "cumsum"])
def test_a_program_gives_the_same_bits_however_many_devices_compute_it(name):
    """A (4, 2) mesh over 1, 2, 4 or 8 executor devices: over 8 the devices split no
    result of the 4 chips along "data" whole, so each result is left split along a chip's
    own dim. Before: the softmax's exp ran in XLA:CPU's YNNPACK fusion of the max on some
    device counts and not others (an ulp apart), and the cumsum's scan was split along
    its own axis by XLA's partitioner."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import jax_trn2

    f = {"softmax": lambda x: jax.nn.softmax(x, axis=-1),
         "cumsum": lambda x: jnp.cumsum(x, axis=1)}[name]
    mesh = jax_trn2.make_mesh((4, 2), ("data", "model"))
    x = np.random.default_rng(1).standard_normal((16, 4608)).astype(np.float32)
    results = [np.asarray(jax_trn2.jit(f, in_shardings=NamedSharding(mesh, P("data")),
                                       executor_devices=jax.devices()[:n])(x))
               for n in (1, 2, 4, 8)]
    for n, result in zip((2, 4, 8), results[1:]):
        assert np.array_equal(result.view(np.uint32), results[0].view(np.uint32)), n
