"""The trn2 PJRT plugin: the simulated Trainium2 machine as a JAX backend.

jax imports this module when it starts its backends (the `jax_plugins` entry point in
pyproject.toml) and calls `initialize()`, which fills the PJRT_Api table in Python
(jax_trn2.plugin.table), hands it to the C shim that jaxlib loads, and registers the plugin
as "trn2" at a priority below the CPU's: jax's default backend stays the CPU, and a user
selects the simulator with `jax.devices("trn2")` or `JAX_PLATFORMS=trn2`.

The client reports the platform name "neuron", AWS's name for Trainium, for which jax
lowers programs, donates buffers and keeps its persistent compilation cache (it does
neither for a platform it does not know); the simulator's devices are listed under the
plugin's name, "trn2", and under "neuron" too when no other plugin has that name (so
`jax.devices(x.device.platform)` finds x's devices; docs/plugin.md says what a user sees).

Device ids number the chips with the fastest links innermost (x, then y inside a server,
then z across servers: mesh.machine.device_order), and jax.make_mesh places a mesh of the
devices on the torus as jax_trn2.make_mesh does (client.device_mesh, jax's mesh builder
for the Trainium2 device kind): both front doors run a program on the same chips.
"""

from __future__ import annotations

import ctypes
import importlib.util

PRIORITY = -100  # below the CPU's 0: installing the plugin does not change jax's default

_api = None  # the PJRT_Api table, alive as long as the process


def library_path() -> str:
    """The C shim's shared library, built when the package was installed."""
    spec = importlib.util.find_spec("jax_trn2.plugin._shim")
    if spec is None or not spec.origin:
        raise ImportError("jax_trn2.plugin._shim, the PJRT plugin's C library, is not built: "
                          "reinstall jax-trn2 with `pip install -e .` (it needs a C compiler)")
    return spec.origin


def initialize() -> None:
    """Register the trn2 plugin with jax (called by jax's plugin discovery)."""
    global _api
    from jax._src import xla_bridge

    from jax_trn2.core import lowerings
    # keeps jax's own lowering of jaxprs before a caller's program replaces it
    from jax_trn2.core import watchers  # noqa: F401
    from jax_trn2.plugin import table
    from jax_trn2.core.platform import PLATFORM_NAME, PLUGIN_NAME

    path = library_path()
    shim = ctypes.CDLL(path)
    if _api is None:
        _api = table.build(shim)
    shim.trn2_set_api.argtypes = [ctypes.c_void_p]
    shim.trn2_set_api(ctypes.addressof(_api))
    lowerings.register(PLATFORM_NAME)
    # jax starts every plugin's backend with its own, and warns for each one it does not
    # know ("Platform 'trn2' is experimental ..."): every program of a user who installed
    # jax-trn2, on any backend, would print it. docs/plugin.md says what the simulator runs.
    xla_bridge._nonexperimental_plugins.add(PLUGIN_NAME)
    xla_bridge.register_plugin(PLUGIN_NAME, priority=PRIORITY, library_path=path)
    xla_bridge.register_backend_initialization_hook(answer_to_platform_name)


def answer_to_platform_name(backend) -> None:
    """List the simulator's backend under the platform its devices report, "neuron", as
    well as under "trn2", so that `jax.devices(device.platform)`, a common idiom, finds the
    simulator's devices (jax looks a backend up by the name it was registered under).

    Not if a plugin registered itself as "neuron" (AWS's own, on a Trainium host): that
    name is then its, whether or not jax started it (JAX_PLATFORMS). jax calls this for
    every backend it starts, under its backend lock: the simulator's is the one that
    reports "neuron" when no "neuron" backend is registered.
    """
    from jax._src import xla_bridge

    from jax_trn2.core.platform import PLATFORM_NAME

    if (backend.platform == PLATFORM_NAME
            and PLATFORM_NAME not in xla_bridge._backend_factories
            and PLATFORM_NAME not in xla_bridge._backends):
        # jax's table of started backends, which jax.devices(name) reads: the same client
        # under a second name (jax.devices() and the default backend are unchanged)
        xla_bridge._backends[PLATFORM_NAME] = backend
