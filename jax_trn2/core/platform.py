"""The names the simulated machine goes by, and its default machine: one place for both
front doors.

jax keys two things by the platform a backend reports (donation, and its persistent
compilation cache: `jax/_src/interpreters/mlir.py`, `compilation_cache.py`), and knows
"neuron", AWS's name for Trainium, among them; it selects a plugin's devices by the name
the plugin is registered under.
"""

PLATFORM_NAME = "neuron"  # what the plugin's client reports: jax lowers for it
PLUGIN_NAME = "trn2"  # jax.devices("trn2"), JAX_PLATFORMS=trn2; jax_trn2.Client's platform
DEVICE_KIND = "Trainium2"  # every simulated device's kind (jax's mesh builder is keyed by it)
DEFAULT_TOPOLOGY = "trn2-ultra"  # the plugin client's machine, and make_mesh's
