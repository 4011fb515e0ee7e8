"""LoadedExecutable: a compiled Trn2 program, run on the simulated mesh."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import lowering
from jax_trn2.device import Buffer, Device
from jax_trn2.mesh import placement_for, topology_for
from mesh import dtypes, isa, printer, sharding
from mesh.executor import compile_program
from mesh.topology import Placement, Topology


class LoadedExecutable:
    """A Trn2 program compiled into one XLA computation over the whole simulated mesh.

    `execute` takes and returns global arrays (shard_map bodies split and assemble them by
    the module's shardings); `execute_sharded` takes and returns one buffer list per device,
    as PJRT does.
    """

    def __init__(self, program: isa.Program, topology: Topology,
                 arg_names: Sequence[str] | None = None):
        self.program = program
        self.topology = topology
        self.placement: Placement | None = placement_for(topology, program.mesh.axis_sizes,
                                                         program.mesh.axis_names)
        self.arg_names = tuple(arg_names) if arg_names is not None else \
            tuple(f"argument {i}" for i in range(len(program.inputs)))
        layouts = [jax.ShapeDtypeStruct((1,) * program.mesh.rank + program.values[v].type.shape,
                                        dtypes.numpy_dtype(program.values[v].type.dtype))
                   for v in program.inputs]
        self._run = compile_program(program).lower(*layouts).compile()

    @classmethod
    def from_stablehlo(cls, topology: Topology | str | None, stablehlo: Any,
                       arg_names: Sequence[str] | None = None) -> "LoadedExecutable":
        """Lower and compile StableHLO for `topology` (None: the one the mesh was made for)."""
        program = lowering.lower(stablehlo)
        if not isinstance(topology, Topology):
            topology = topology_for(program.mesh.axis_sizes, program.mesh.axis_names, topology)
        return cls(program, topology, arg_names)

    def devices(self) -> list[Device]:
        """The chips the program runs on, in logical device order (row-major over the mesh)."""
        chips = self.placement.device_to_chip if self.placement else (0,)
        return [Device(c, self.topology.coords(c)) for c in chips]

    def as_text(self) -> str:
        """The Trn2 program listing."""
        return printer.program_text(self.program)

    def execute(self, args: Sequence[Any]) -> list[jax.Array]:
        """Run on global arrays; returns the global results."""
        arrays = self._check_args(args)
        nm = self.program.mesh.rank
        outs = self._run(*[a.reshape((1,) * nm + a.shape) for a in arrays])
        return [o[(0,) * nm] for o in outs]

    def execute_sharded(self, per_device_args: Sequence[Sequence[Any]]) -> list[list[Buffer]]:
        """Run on one argument list per device (logical device order); returns one result
        list per device. Inputs the program replicates must be equal on every device."""
        devices = self.devices()
        if len(per_device_args) != len(devices):
            raise TypeError(f"execute_sharded: expected argument lists for {len(devices)} "
                            f"devices, got {len(per_device_args)}")
        globals_ = [self._assemble(i, [np.asarray(dev_args[i]) for dev_args in per_device_args])
                    for i in range(len(self.program.inputs))]
        outs = self.execute(globals_)
        per_output = [self._split(i, np.asarray(o)) for i, o in enumerate(outs)]
        return [[Buffer(pieces[d], device) for pieces in per_output]
                for d, device in enumerate(devices)]

    def _assemble(self, i: int, pieces: list[np.ndarray]) -> np.ndarray:
        dim_axes = self._sharding(self.program.input_shardings, i, pieces[0].ndim)
        try:
            return sharding.assemble(pieces, dim_axes, self.program.mesh.axis_sizes)
        except ValueError as e:
            raise ValueError(f"{self.arg_names[i]}: {e}") from None

    def _split(self, i: int, array: np.ndarray) -> list[np.ndarray]:
        dim_axes = self._sharding(self.program.output_shardings, i, array.ndim)
        return sharding.split(array, dim_axes, self.program.mesh.axis_sizes)

    @staticmethod
    def _sharding(shardings: tuple, i: int, rank: int):
        given = shardings[i] if i < len(shardings) else None
        return given if given is not None else ((),) * rank

    def _check_args(self, args: Sequence[Any]) -> list[jnp.ndarray]:
        """Arguments as arrays of exactly the program's input types; TypeError naming the
        argument, what was expected and what was given otherwise."""
        expected = [self.program.values[v].type for v in self.program.inputs]
        if len(args) != len(expected):
            raise TypeError(f"expected {len(expected)} arguments "
                            f"({', '.join(self.arg_names)}), got {len(args)}")
        return [self._check_arg(name, arg, t)
                for name, arg, t in zip(self.arg_names, args, expected)]

    @staticmethod
    def _check_arg(name: str, arg: Any, expected: isa.TensorType) -> jnp.ndarray:
        if isinstance(arg, Buffer):
            arg = arg.to_jax()
        if isinstance(arg, (bool, int, float)):  # Python scalars take the parameter's type
            arg = np.asarray(arg, dtype=dtypes.numpy_dtype(expected.dtype))
        shape, dtype = tuple(np.shape(arg)), getattr(arg, "dtype", None)
        got = f"{np.dtype(dtype).name if dtype is not None else type(arg).__name__}" \
              f"[{','.join(map(str, shape))}]"
        if dtype is None or np.dtype(dtype).name != expected.dtype or shape != expected.shape:
            raise TypeError(f"{name}: expected {expected}, got {got}")
        return jnp.asarray(arg)
