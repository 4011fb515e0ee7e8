"""Host CPU devices that stand in for a mesh's chips wherever jax needs real devices.

jax.set_mesh, NamedSharding and XLA's SPMD partitioner want a concrete device list; a
jaxlib CPU client with one device per chip provides it (nothing runs on it unless the user
runs plain jax.jit on it, e.g. for a CPU reference).
"""

from __future__ import annotations

import functools

from jax._src.lib import xla_client


@functools.cache
def host_client(num_devices: int):
    """A jaxlib CPU client with `num_devices` devices (one per simulated chip), made once."""
    if num_devices < 1:
        raise ValueError(f"a host client needs at least one device, got {num_devices}")
    return xla_client.make_cpu_client(num_devices=num_devices)


def host_devices(num_devices: int) -> list:
    """The devices of host_client(num_devices), in id order."""
    return list(host_client(num_devices).devices())
