"""gather and scatter in the forms jax emits (indexing, take_along_axis, .at[...]), inside
shard_map bodies on the 4x4x4 mesh, compared with CPU JAX.

Indices are made on each chip from jax.lax.axis_index, so the index operand varies across
chips while the operand may be replicated (or vary along other axes). Gather and scatter
move data without arithmetic, except scatter's combiners, which XLA and the simulator apply
update by update in the operand's type: every comparison is exact.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from e2e_reference import assert_matches, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))
EVERY_CHIP = P(("x", "y", "z"))  # every chip's local result, side by side


def chip_indices(count: int, size: int) -> jnp.ndarray:
    """`count` indices into a dim of `size` that differ from chip to chip (along y and z),
    with repeats, and with one index past the end and one negative (jnp wraps it)."""
    step = lax.axis_index("y") * 4 + lax.axis_index("z") + 1
    indices = (step * jnp.arange(count) + lax.axis_index("z")) % size
    return indices.at[0].set(size + 1).at[1].set(-1)


def test_gather_forms(rng):
    """Integer-array indexing of one dim, of a middle dim, of two dims at once, with a
    slice, and jnp.take with the fill mode; a replicated operand and per-chip indices."""
    x = rng.standard_normal((6, 5, 4)).astype(np.float32)

    def body(x):
        i, j = chip_indices(7, 6), chip_indices(7, 5)
        return {
            "rows": x[i],  # an index past the end is clamped to the last row
            "middle": x[:, j],
            "pairs": x[i, j],
            "with_slice": x[i, 1:4],
            "take_fill": jnp.take(x, i, axis=0, mode="fill", fill_value=-1.0),
            "scalar": x[i[3], j[2]],
        }

    got, want = run_both(body, *MESH, P(), EVERY_CHIP, x)
    assert_matches(got, want, exact=True)


def test_gather_with_batching_dims(rng):
    """take_along_axis (gather with operand_batching_dims) on per-chip data, by per-chip
    argsort orders; and a vmapped dynamic index."""
    x = rng.standard_normal((16, 6, 5)).astype(np.float32)

    def body(x):
        order = jnp.argsort(x, axis=1)
        starts = (jnp.arange(x.shape[0]) + lax.axis_index("x")) % x.shape[1]
        return {
            "along_axis": jnp.take_along_axis(x, order, axis=1),
            "vmapped": jax.vmap(lambda row, s: row[s])(x, starts),
        }

    got, want = run_both(body, *MESH, P("x"), P("x"), x)
    assert_matches(got, want, exact=True)


def test_scatter_combiners(rng):
    """.at[].set/add/mul/min/max with repeated, out-of-range and negative per-chip indices,
    into an operand that varies along x: duplicates combine, out-of-range updates drop."""
    x = rng.standard_normal((16, 5)).astype(np.float32)
    n = rng.integers(-50, 50, (16, 5)).astype(np.int32)

    def body(x, n):
        i = chip_indices(6, 4)
        u = jnp.arange(6.0, dtype=jnp.float32)[:, None] * 0.5 - 1.0
        return {
            "set": x.at[i].set(u),
            "add": x.at[i].add(u),
            "mul": x.at[i].multiply(u),
            "min": x.at[i, 2].min(u[:, 0]),
            "max": x.at[i].max(u),
            "int_add": n.at[i, i % 5].add(jnp.arange(6, dtype=jnp.int32)),
            "bool_set": (n > 0).at[i].set(False),
        }

    got, want = run_both(body, *MESH, (P("x"), P("x")), EVERY_CHIP, x, n)
    assert_matches(got, want, exact=True)


def test_scatter_with_update_computation(rng):
    """.at[].apply: an update computation that is not a combiner (run update by update);
    and a vmapped .at[].set, a scatter with input_batching_dims."""
    x = rng.standard_normal((16, 6)).astype(np.float32)

    def body(x):
        i = chip_indices(5, 4)
        rows = (jnp.arange(x.shape[0]) + lax.axis_index("y")) % x.shape[1]
        return {
            "apply": x.at[i].apply(lambda v: v * 2.0 + 1.0),
            "vmapped_set": jax.vmap(lambda row, r: row.at[r].set(-5.0))(x, rows),
        }

    got, want = run_both(body, *MESH, P("x"), EVERY_CHIP, x)
    assert_matches(got, want, exact=True)


def test_gradient_of_indexing(rng):
    """The gradient of a gather is a scatter-add and that of .at[].set a gather (and
    a select); per-chip indices with repeats, so the scatter-add combines."""
    x = rng.standard_normal((16, 6)).astype(np.float32)

    def loss(x):
        i = chip_indices(8, 4)
        picked = x[i] * jnp.arange(1.0, 9.0)[:, None]
        return jnp.sum(picked ** 2) + jnp.sum(jnp.sin(x.at[i[:3]].set(0.5)))

    # Products and sums of a few terms in FP32: FLOAT_RTOL (2**-14 relative) covers the
    # different order XLA may sum the eight gathered rows in.
    got, want = run_both(jax.grad(loss), *MESH, P("x"), P("x"), x)
    assert_matches(got, want)
