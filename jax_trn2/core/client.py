"""The PJRT-style client of a simulated Trainium2 machine."""

from __future__ import annotations

from typing import Any, Sequence

from jax_trn2.core.device import Buffer, Device
from jax_trn2.core.platform import PLUGIN_NAME
from jax_trn2.core.executable import LoadedExecutable
from jax_trn2.core.platform import DEFAULT_TOPOLOGY
from mesh import numerics
from mesh.machine import Topology, get_topology

class Client:
    """A simulated Trainium2 machine (PJRT client): its devices, compiler and buffers."""

    platform_name = PLUGIN_NAME

    def __init__(self, topology: str | Topology = DEFAULT_TOPOLOGY):
        self.topology = topology if isinstance(topology, Topology) else get_topology(topology)
        self._devices = tuple(Device(i, self.topology.device_coords(i))
                              for i in range(self.topology.num_devices))

    def devices(self) -> list[Device]:
        """All devices by id: the chips (row-major over the torus), or on a machine of
        logical NeuronCores each chip's cores in turn (Topology.device_coords)."""
        return list(self._devices)

    def device_count(self) -> int:
        return len(self._devices)

    def compile(self, program: Any, *, rounding: str = "nearest", seed: int = 0,
                executor_devices: Sequence[Any] | None = None,
                device_assignment: Sequence[Device | int] | None = None,
                check_memory: bool = True) -> LoadedExecutable:
        """Compile StableHLO (MLIR text, bytecode, or a jaxlib ir.Module) for this machine.

        Raises jax_trn2.OutOfHBMError when the program needs more HBM on some chip than the
        chip has, as PJRT's compile fails with RESOURCE_EXHAUSTED (`check_memory=False`
        compiles it anyway).

        `rounding` is "nearest" (round-to-nearest-even) or "stochastic" (with `seed`) for
        every rounding to BF16/FP16/FP8 (mesh.numerics). `executor_devices`: JAX devices
        that run the simulation together (see jax_trn2.jit). `device_assignment`: the
        device (or chip id) each process runs on, in process order (default: PJRT's, the
        first devices)."""
        chips = None if device_assignment is None else \
            [d.id if isinstance(d, Device) else d for d in device_assignment]
        return LoadedExecutable.from_stablehlo(
            self.topology, program, rounding=numerics.Rounding(rounding, seed),
            executor_devices=executor_devices, device_assignment=chips).load(check_memory)

    def buffer_from_pyval(self, array: Any, device: Device | None = None) -> Buffer:
        """Put a host array on a chip (the first one by default)."""
        device = self._devices[0] if device is None else device
        if device not in self._devices:
            raise ValueError(f"{device} is not a device of this {self.topology.name} client")
        return Buffer(array, device)

    def __repr__(self) -> str:
        return f"Client(platform={PLUGIN_NAME!r}, topology={self.topology.name!r}, " \
               f"devices={len(self._devices)})"


def client(topology: str | Topology = DEFAULT_TOPOLOGY) -> Client:
    """A client for a simulated Trainium2 topology: trn2, trn2-ultra (default) or
    trn2-ultra-max, or a Topology with your own numbers."""
    return Client(topology)
