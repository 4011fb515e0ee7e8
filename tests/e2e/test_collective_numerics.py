"""BF16 collectives on the 4x4x4 mesh add in the order of the ring algorithm, every partial
sum rounded to BF16 (mesh.isa.kernels.ring_order), checked bit for bit against that order
written out element by element; reductions across chips treat -0 and NaN as StableHLO says."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_trn2

BF16 = ml_dtypes.bfloat16
RING = 4  # every axis of the 4x4x4 mesh


def spread_values(rng, shape):
    """BF16 values whose magnitudes span 2**12, so that partial sums depend on the order."""
    return (rng.standard_normal(shape) * 2.0 ** rng.integers(0, 12, shape)).astype(BF16)


def fold(values):
    """Add in the given order, rounding every partial sum to BF16 (FP32 adds)."""
    acc = values[0]
    for v in values[1:]:
        acc = BF16(np.float32(acc) + np.float32(v))
    return acc


def ring_order(owner_coord: int, forward: bool) -> list[int]:
    """Members in the order a bidirectional ring adds a chunk owned by `owner_coord`: the
    first half of the chunk from the next member round to the owner, the second half the
    other way."""
    step = 1 if forward else -1
    return [(owner_coord + step * s) % RING for s in range(1, RING + 1)]


def test_psum_adds_each_chunk_around_the_ring(rng):
    mesh = jax_trn2.make_mesh()
    a = spread_values(rng, (16, 24))  # chip (x, y, z) holds a[4x:4x+4, 6y:6y+6]
    step = jax_trn2.jit(jax.shard_map(lambda a: jax.lax.psum(a, "y"), mesh=mesh,
                                      in_specs=P("x", "y"), out_specs=P("x", None)))
    got = np.asarray(step(a))
    n, block = 24, 6  # elements per chip; per owner (n / ring)
    for x in range(4):
        members = [a[4 * x:4 * x + 4, 6 * y:6 * y + 6].ravel() for y in range(RING)]
        want = [fold([members[y][e] for y in ring_order(e // block, e % block < block // 2)])
                for e in range(n)]
        np.testing.assert_array_equal(got[4 * x:4 * x + 4].ravel(), np.array(want, BF16))


def test_psum_scatter_over_two_axes_reduces_x_then_z(rng):
    mesh = jax_trn2.make_mesh()
    a = spread_values(rng, (64, 32))  # chip (x, y, z) holds rows 4(4x+z) .. +4
    body = lambda a: jax.lax.psum_scatter(a, ("x", "z"), scatter_dimension=1, tiled=True)
    step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=P(("x", "z"), None),
                                      out_specs=P(None, ("x", "z"))))
    got = np.asarray(step(a))  # [4, 32]: member r = 4x + z holds columns 2r, 2r + 1
    # The scattered dim leads the ring's buffer: element e = 4 * column + row.
    members = {(x, z): a[4 * (4 * x + z):4 * (4 * x + z) + 4].T.ravel()
               for x in range(RING) for z in range(RING)}
    block = 8  # 128 elements over 16 owners
    for e in range(128):
        owner_x, owner_z = divmod(e // block, RING)
        forward = e % block < block // 2
        along_x = {z: fold([members[x, z][e] for x in ring_order(owner_x, forward)])
                   for z in range(RING)}
        want = fold([along_x[z] for z in ring_order(owner_z, forward)])
        column, row = divmod(e, 4)
        assert got[row, column] == want, (e, got[row, column], want)


def test_psum_of_a_replicated_value_adds_it_to_itself_around_the_ring(rng):
    mesh = jax_trn2.make_mesh()
    a = spread_values(rng, (16, 24))  # the same on every z
    step = jax_trn2.jit(jax.shard_map(lambda a: jax.lax.psum(a, "z"), mesh=mesh,
                                      in_specs=P("x", "y"), out_specs=P("x", "y")))
    want = np.vectorize(lambda v: fold([v] * RING), otypes=[BF16])(a)
    np.testing.assert_array_equal(np.asarray(step(a)), want)


def test_max_and_min_over_a_sharded_axis_propagate_nan_as_unsharded():
    # XLA's CPU all-reduce skips NaN, so the reference is the unsharded reduction.
    mesh = jax_trn2.make_mesh((2, 2), ("a", "b"))
    x = np.array([1, 2, np.nan, 3, 5, 9, 0, -1], np.float32)
    sharded = NamedSharding(mesh, P(("a", "b")))
    for reduce in (jnp.max, jnp.min, jnp.argmax, jnp.argmin):
        got = jax_trn2.jit(reduce, in_shardings=sharded)(x)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(reduce)(x)))


def test_psum_and_pmax_apply_the_reducer_to_the_members_alone():
    # StableHLO's all_reduce adds no identity: -0 + -0 is -0 (XLA's CPU collectives give +0).
    # A NaN member makes the max NaN, as `maximum` does (XLA's CPU collectives skip it).
    mesh = jax_trn2.make_mesh((4,), ("i",))
    x = np.array([[-0.0, np.nan], [-0.0, 1.0], [-0.0, 2.0], [-0.0, 3.0]], np.float32)
    both = lambda a: (jax.lax.psum(a, "i"), jax.lax.pmax(a, "i"))
    step = jax_trn2.jit(jax.shard_map(both, mesh=mesh, in_specs=P("i"), out_specs=P()))
    total, largest = (np.asarray(r)[0] for r in step(x))
    assert np.signbit(total[0]) and total[0] == 0
    assert np.isnan(total[1]) and np.signbit(largest[0]) and np.isnan(largest[1])
