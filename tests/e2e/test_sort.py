"""sort and top_k as jax emits them (jnp.sort, argsort, lexsort, lax.sort with num_keys,
lax.top_k), inside shard_map bodies on the 4x4x4 mesh with per-chip data, compared exactly
with CPU JAX: sorting only moves data."""

from __future__ import annotations

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

from e2e_reference import assert_same_bits, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))

SPECIALS = [np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 1.0, 0.0]


def with_specials(rng, shape, dtype) -> np.ndarray:
    """Normals with NaNs of both signs, both zeros, infinities and repeats in every row."""
    x = rng.standard_normal(shape)
    x[..., :len(SPECIALS)] = SPECIALS
    x = rng.permuted(x, axis=-1)
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_sort_floats(rng, dtype):
    """Ascending and descending along both dims: NaNs last, -0.0 and +0.0 equal (so they
    keep their order), per-chip data along x and y."""
    x = with_specials(rng, (16, 16, 12), dtype)

    def body(x):
        return {"last": jnp.sort(x, axis=-1), "first": jnp.sort(x, axis=0),
                "descending": jnp.sort(x, axis=-1, descending=True)}

    got, want = run_both(body, *MESH, P("x", "y"), P("x", "y"), x)
    assert_same_bits(got, want)


def test_argsort_is_stable(rng):
    """argsort of data with many ties (a two-operand sort with the indices as payload):
    equal keys keep their order, ascending and descending."""
    keys = rng.integers(0, 4, (16, 24)).astype(np.int32)
    floats = with_specials(rng, (16, 24), np.float32)

    def body(keys, floats):
        return {"ints": jnp.argsort(keys, axis=-1), "floats": jnp.argsort(floats, axis=-1),
                "descending": jnp.argsort(keys, axis=-1, descending=True),
                "axis0": jnp.argsort(keys, axis=0)}

    got, want = run_both(body, *MESH, (P("x"), P("y")), P(("x", "y")), keys, floats)
    assert_same_bits(got, want)


def test_multi_key_sorts(rng):
    """lexsort (num_keys = 2 of 2) and lax.sort with three operands and num_keys = 2: ties
    on the first key are broken by the second, the third is payload."""
    a = rng.integers(0, 3, (16, 20)).astype(np.int32)
    b = with_specials(rng, (16, 20), np.float32)
    c = rng.integers(0, 2, (16, 20)).astype(np.uint8)

    def body(a, b, c):
        return {"lexsort": jnp.lexsort((b, a), axis=-1),
                "num_keys": lax.sort((a, c, b), dimension=1, num_keys=2),
                "unstable": lax.sort((b, a), dimension=1, is_stable=False, num_keys=2)}

    got, want = run_both(body, *MESH, (P("x"), P("y"), P("z")), P(("x", "y", "z")), a, b, c)
    assert_same_bits(got, want)


def test_top_k_and_median(rng):
    """lax.top_k (ties go to the lower index) on per-chip floats and ints, and jnp.median,
    which sorts."""
    x = with_specials(rng, (16, 4, 12), np.float32)
    n = rng.integers(-3, 3, (16, 4, 12)).astype(np.int32)

    def body(x, n):
        return {"floats": lax.top_k(x, 4), "ints": lax.top_k(n, 5),
                "median": jnp.median(jnp.nan_to_num(x), axis=-1)}

    got, want = run_both(body, *MESH, (P("x"), P("x")), P("x"), x, n)
    assert_same_bits(got, want)
