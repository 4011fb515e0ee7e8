"""shard_map programs as jax emits them without Shardy (jax_use_shardy_partitioner=False):
GSPMD custom calls (Sharding, SPMDFullToShardShape, SPMDShardToFullShape) on a mesh named
only by the programs' shardings, compared with CPU JAX."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, cpu_mesh, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))


def test_manual_body_with_transposed_axes(gspmd, rng):
    """Dims split over (x, z) and y: the mesh is recovered from the tilings, collectives
    and axis_index see the same axes as with Shardy."""
    x = rng.standard_normal((16, 16)).astype(np.float32)

    def body(a):
        return lax.psum(a * lax.axis_index("z"), "y") + jax.numpy.cumsum(a, axis=1)

    got, want = run_both(body, *MESH, P(("x", "z"), "y"), P(("x", "z"), "y"), x)
    # A sum of four FP32 terms and a cumsum of four: FLOAT_RTOL covers any order.
    assert_matches(got, want)
    program = jax_trn2.jit(jax.shard_map(body, mesh=jax_trn2.make_mesh(),
                                         in_specs=P(("x", "z"), "y"),
                                         out_specs=P(("x", "z"), "y"))).lower(x).program
    assert program.mesh.axis_sizes == (4, 4, 4)


def test_partially_manual_body(gspmd, rng):
    """shard_map over y only (axis_names): x and z stay automatic, and axis_index inside
    is a nested fully manual body whose result leaves along x and z only."""
    x = rng.standard_normal((16, 8)).astype(np.float32)

    def program(mesh):
        return jax.shard_map(lambda a: lax.psum(a * 2 + lax.axis_index("y"), "y"), mesh=mesh,
                             in_specs=P("y"), out_specs=P(), axis_names={"y"})

    got = jax_trn2.jit(program(jax_trn2.make_mesh()))(x)
    want = jax.jit(program(cpu_mesh(*MESH)))(x)
    assert_matches(got, want)  # sums of four FP32 terms


def test_named_shardings_partitioned_by_gspmd(gspmd, rng):
    """Without Shardy, jit's in_shardings are mhlo.sharding tilings on main, and GSPMD's
    partitioner makes each chip's program."""
    from jax.sharding import NamedSharding

    mesh = cpu_mesh(*MESH)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    x = rng.standard_normal((64, 32)).astype(np.float32)
    grad = jax.grad(lambda w, x: (jax.numpy.tanh(x @ w) ** 2).mean())
    kwargs = dict(in_shardings=(NamedSharding(mesh, P("y", "z")),
                                NamedSharding(mesh, P(("x", "y")))))
    step = jax_trn2.jit(grad, **kwargs)
    assert_matches(step(w, x), jax.jit(grad, **kwargs)(w, x))
    assert any(i.why for i in step.lower(w, x).program.instructions)


@pytest.mark.parametrize("make", [
    lambda mesh, x: jax.shard_map(lambda u: lax.psum(u, "b"), mesh=mesh, in_specs=P("a", "b"),
                                  out_specs=P("a")),
    lambda mesh, x: lambda u: u @ x.T,  # the partitioner chooses the result's layout
    lambda mesh, x: lambda u: jax.lax.with_sharding_constraint(
        u * 2, jax.sharding.NamedSharding(mesh, P("a", "b"))),
])
def test_results_carry_the_shardings_jax_jit_gives_without_shardy(gspmd, make):
    """XLA's layouts of a GSPMD program (over its devices in order) named on the
    arguments' mesh, as jax names them."""
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    results = []
    for jit, mesh in ((jax.jit, cpu_mesh((2, 4), ("a", "b"))),
                      (jax_trn2.jit, jax_trn2.make_mesh((2, 4), ("a", "b")))):
        placed = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("a", "b")))
        results.append(jit(make(mesh, x))(placed))
    got, want = results
    assert got.sharding.spec == want.sharding.spec
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
