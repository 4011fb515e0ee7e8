"""Host callbacks: the user's Python function, run on the host once per chip.

The executor is one XLA computation for every chip; a callback leaves it through
jax.pure_callback (a callback with results and no side effect) or jax.experimental's
io_callback (one with side effects, which XLA must neither drop nor repeat). On the host the
operands arrive stacked over the mesh axes; the user's function is called chip by chip in
device order (row-major over the mesh), each time with that chip's values, as CPU JAX calls
it once per device; its results are stacked back.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from mesh import dtypes, isa
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext


@kernel(isa.HostCallback)
def host_callback(instr: isa.HostCallback, args, ctx: KernelContext):
    mesh_shape = tuple(ctx.mesh.axis_sizes)
    nm = ctx.nm
    out_types = [ctx.out_info(instr, i).type for i in range(len(instr.outs))]
    result_shapes = [jax.ShapeDtypeStruct(mesh_shape + t.shape, dtypes.numpy_dtype(t.dtype))
                     for t in out_types]

    # Chips a conditional or loop that differs from chip to chip did not bring here: their
    # callback does not run (their results, zeros, are discarded by that conditional).
    reached = jnp.ones((1,) * nm, bool) if ctx.active is None else ctx.active

    def on_host(reached, *stacked):
        reached = np.broadcast_to(np.asarray(reached), mesh_shape)
        stacked = [np.broadcast_to(np.asarray(a), mesh_shape + a.shape[nm:]) for a in stacked]
        results = [np.zeros(s.shape, s.dtype) for s in result_shapes]
        for chip in itertools.product(*(range(n) for n in mesh_shape)):
            if reached[chip]:
                with jax.enable_x64(instr.x64):  # not the executor's: the user's setting
                    outs = instr.callback(*(a[chip] for a in stacked))
                for collected, out in zip(results, outs):
                    collected[chip] = np.asarray(out, collected.dtype)
        return tuple(results)

    if instr.has_side_effect:
        results = io_callback(on_host, tuple(result_shapes), reached, *args, ordered=True)
    else:
        results = jax.pure_callback(on_host, tuple(result_shapes), reached, *args)
    return list(results)
