"""The plugin on a machine as AWS rents it: jax.devices("trn2") lists a device per
logical NeuronCore, as on a real Trn2 instance (each check in a fresh process: the
plugin's client is made once per process)."""

from pathlib import Path

from test_install import run

ROOT = Path(__file__).resolve().parents[3]

DEVICES = """
import jax
devices = jax.devices("trn2")
print("count", len(devices))
print("limits", sorted({d.memory_stats()["bytes_limit"] for d in devices}))
print("coords", [tuple(d.coords) for d in devices[:6]])
"""


def test_trn2_48xlarge_lists_64_devices_of_24_gib():
    out = run(DEVICES, ROOT, JAX_TRN2_TOPOLOGY="trn2.48xlarge", PYTHONPATH=str(ROOT))
    assert "count 64" in out
    assert f"limits [{24 * 2**30}]" in out
    # a chip's 4 cores, then the next chip along x
    assert "coords [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 0, 3), (1, 0, 0), (1, 0, 1)]" in out


def test_lnc_1_lists_8_devices_per_chip():
    out = run(DEVICES, ROOT, JAX_TRN2_TOPOLOGY="trn2.3xlarge", JAX_TRN2_LNC="1",
              PYTHONPATH=str(ROOT))
    assert "count 8" in out and f"limits [{12 * 2**30}]" in out


PSUM = """
import jax, numpy as np
from jax.sharding import AxisType, PartitionSpec as P
mesh = jax.make_mesh((16, 4), ("fsdp", "tp"), (AxisType.Auto,) * 2, devices=jax.devices("trn2"))
f = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "tp"), mesh=mesh,
                          in_specs=P("fsdp", "tp"), out_specs=P("fsdp")))
x = np.arange(64 * 3, dtype=np.float32).reshape(16, 12)
print("match", np.array_equal(np.asarray(f(x)), x.reshape(16, 4, 3).sum(1)))
"""


def test_a_64_device_program_runs_on_a_trn2_48xlarge():
    out = run(PSUM, ROOT, JAX_TRN2_TOPOLOGY="trn2.48xlarge", JAX_PLATFORMS="trn2",
              PYTHONPATH=str(ROOT))
    assert "match True" in out
