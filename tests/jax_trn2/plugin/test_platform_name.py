"""The platform the simulator's devices report, "neuron", names them to jax.devices, unless
another plugin (AWS's own) is registered under that name."""

import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np

REPO = Path(__file__).resolve().parents[3]


def test_a_devices_platform_finds_its_devices():
    devices = jax.devices("trn2")
    x = jax.device_put(np.arange(4.0), devices[3])
    platform = x.sharding.device_set.pop().platform
    assert platform == "neuron"
    assert jax.devices(platform) == devices
    assert jax.local_devices(backend=platform) == jax.local_devices(backend="trn2")
    assert jax.default_backend() == "cpu"  # the simulator's second name changes no default


# A backend registered as "neuron" before jax starts its backends, as AWS's plugin is
# (a CPU client stands in for it): "neuron" is then that backend's name
_WITH_ANOTHER_NEURON_PLUGIN = textwrap.dedent("""
    from jax._src import xla_bridge
    from jax._src.lib import xla_client
    xla_bridge.register_backend_factory("neuron", xla_client.make_cpu_client, priority=-200)
    import jax
    print(jax.devices("neuron")[0].platform, jax.devices("trn2")[0].platform)
""")


def test_another_neuron_plugin_keeps_its_name():
    out = subprocess.run([sys.executable, "-c", _WITH_ANOTHER_NEURON_PLUGIN], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "neuron"]
