"""What the parallelism examples share: the CPU JAX reference mesh, the comparison with it,
and the cost summary of a compiled step.

Import this module before anything else uses JAX: it asks for 64 CPU host devices, which
only the CPU reference runs on (the simulated mesh needs no host devices).
"""

from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 64)

import numpy as np  # noqa: E402
from jax.sharding import AxisType  # noqa: E402

MESH_SHAPE, MESH_AXES = (4, 4, 4), ("x", "y", "z")


def cpu_mesh(shape=MESH_SHAPE, names=MESH_AXES) -> jax.sharding.Mesh:
    """The same logical mesh over CPU host devices, for the reference run."""
    devices = jax.devices("cpu")[: int(np.prod(shape))]
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=devices)


def relative_error(got, want) -> float:
    """Largest |got - want| over every leaf, relative to the largest |want| of that leaf."""
    worst = 0.0
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        worst = max(worst, float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)))
    return worst


def check_close(what: str, got, want, rtol: float) -> float:
    """The relative error of `got` against the CPU reference; AssertionError above `rtol`."""
    error = relative_error(got, want)
    print(f"{what}: max relative difference from CPU JAX {error:.2e} (limit {rtol:.0e})")
    assert error <= rtol, f"{what} differs from CPU JAX by {error:.3g} (limit {rtol:.3g})"
    return error


def train_and_check(step, reference, params, batch: tuple, steps: int,
                    rtol: float) -> list[float]:
    """Run `steps` training steps `params, loss = step(params, *batch)` on the simulated
    mesh and with `reference` on CPU JAX; check losses and final weights agree within
    `rtol` and that the loss falls. Returns the simulated losses."""
    sim, ref = params, params
    losses, ref_losses = [], []
    for i in range(steps):
        sim, loss = step(sim, *batch)
        ref, ref_loss = reference(ref, *batch)
        losses.append(float(loss))
        ref_losses.append(float(ref_loss))
        print(f"step {i}: loss {losses[-1]:.5f} (CPU JAX {ref_losses[-1]:.5f})")
    check_close("losses", losses, ref_losses, rtol)
    check_close("weights after training", sim, ref, rtol)
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    return losses


def print_cost(compiled) -> dict:
    """Print the estimated per-chip cost of a jax_trn2 compiled step; returns the numbers
    (jax's cost_analysis keys and a 'trn2' breakdown)."""
    print(compiled.executable.estimate.summary())
    return compiled.cost_analysis()
