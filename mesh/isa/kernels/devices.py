"""Helpers for kernels that work chip by chip: broadcasting and vmapping over mesh dims, and
splitting a custom call over the executor devices."""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec


def broadcast_mesh(args: Sequence[jnp.ndarray], nm: int) -> list[jnp.ndarray]:
    """Broadcast the leading `nm` mesh dims of every arg to their common shape."""
    mesh_shape = np.broadcast_shapes(*(a.shape[:nm] for a in args))
    return [jnp.broadcast_to(a, mesh_shape + a.shape[nm:]) for a in args]


def map_devices(fn: Callable, args: Sequence[jnp.ndarray], nm: int) -> list[jnp.ndarray]:
    """Apply `fn(*local_args) -> list of local arrays` on every chip.

    Mesh dims along which no argument varies are not mapped (the work is done once there);
    the others are vmapped, an argument of size 1 along a dim being broadcast.
    """
    varying = [any(a.shape[d] > 1 for a in args) for d in range(nm)]
    squeezed = [a.reshape(tuple(s for d, s in enumerate(a.shape[:nm]) if varying[d])
                          + a.shape[nm:]) for a in args]
    arg_varying = [[a.shape[d] > 1 for d in range(nm) if varying[d]] for a in args]

    mapped = fn
    for level in reversed(range(sum(varying))):
        in_axes = [0 if av[level] else None for av in arg_varying]
        mapped = jax.vmap(mapped, in_axes=in_axes)
    results = mapped(*[_drop_unmapped(a, av) for a, av in zip(squeezed, arg_varying)])
    return [r.reshape(_layout(r, varying)) for r in results]


def _drop_unmapped(a: jnp.ndarray, arg_varying: list[bool]) -> jnp.ndarray:
    """Remove the size-1 dims an arg has where other args vary (vmap's in_axes=None)."""
    keep = [i for i, v in enumerate(arg_varying) if v]
    return a.reshape(tuple(a.shape[i] for i in keep) + a.shape[len(arg_varying):])


def _layout(r: jnp.ndarray, varying: list[bool]) -> tuple[int, ...]:
    it = iter(r.shape)
    mesh = tuple(next(it) if v else 1 for v in varying)
    return mesh + tuple(it)


def on_executor_devices(fn: Callable[[jax.Array], jax.Array], x: jax.Array, nm: int,
                        executor: Mesh | None) -> jax.Array:
    """fn(x), an array whose leading `nm` dims are x's mesh dims, computed by the executor
    devices (`executor`, KernelContext.executor: None for one) each on its slice of x along
    the first mesh dim they divide (jax.shard_map), for a custom call: XLA's partitioner
    cannot split one, and would gather x to every device for all of it. Where they divide
    no mesh dim of x, every device computes all of fn(x)."""
    devices = 1 if executor is None else executor.size
    axis = next((a for a in range(nm) if devices > 1 and x.shape[a] % devices == 0), None)
    if axis is None:
        return fn(x)
    split = PartitionSpec(*("executor" if d == axis else None for d in range(nm)))
    return jax.shard_map(fn, mesh=executor, in_specs=split, out_specs=split)(x)
