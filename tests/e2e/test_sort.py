"""sort and top_k as jax emits them (jnp.sort, argsort, lexsort, lax.sort with num_keys,
lax.top_k, lax.approx_max_k and approx_min_k), inside shard_map bodies on the 4x4x4 mesh with per-chip data, compared exactly
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


def test_approx_max_and_min_k(rng):
    """lax.approx_max_k and approx_min_k (exact off the TPU) on rows with repeats, zeros of
    both signs and infinities, for k of one (a reduce) and more (a sort), along either
    dim, and without aggregate_to_topk: the values as XLA:CPU gives them, bit for bit, and
    indices of those values, each once. Which of tied elements comes first is XLA's
    unstable sort's choice, which the program around it can change (measured: XLA:CPU
    orders a row's ties otherwise when a second top-k sorts the same row). No NaNs: jax's
    comparator (the values compared GT, or LT) is then not a strict weak order."""
    x = with_specials(rng, (16, 4, 40), np.float32)
    x = np.where(np.isnan(x), np.float32(1.0), x)
    tops = {"max": lambda v: lax.approx_max_k(v, 3), "min": lambda v: lax.approx_min_k(v, 2),
            "one": lambda v: lax.approx_max_k(v, 1),
            "first_dim": lambda v: lax.approx_min_k(v, 2, reduction_dimension=1),
            "unaggregated": lambda v: lax.approx_max_k(v, 2, aggregate_to_topk=False)}

    def body(x):
        return {name: top(x) for name, top in tops.items()}

    got, want = run_both(body, *MESH, (P("x"),), P("x"), x)
    assert_same_bits({name: values for name, (values, _) in got.items()},
                     {name: values for name, (values, _) in want.items()})
    for name, (values, indices) in got.items():
        axis = 1 if name == "first_dim" else 2
        assert_same_bits(np.take_along_axis(x, np.asarray(indices), axis), values)
        ordered = np.sort(np.asarray(indices), axis=axis)
        assert (np.diff(ordered, axis=axis) > 0).all(), name


def test_approx_max_k_of_a_long_row_without_aggregating(rng):
    """Without aggregate_to_topk, XLA keeps as many as the TPU's approximation would, a
    count that depends on the operand's rank: a 1-D row of 1000 keeps all 1000 (a 2-D
    one would keep 256), sorted."""
    x = rng.standard_normal(4 * 1000).astype(np.float32)

    def body(x):
        return lax.approx_max_k(x, 3, aggregate_to_topk=False)

    got, want = run_both(body, *MESH, (P("x"),), P("x"), x)
    assert np.shape(got[0]) == (4 * 1000,)
    assert_same_bits(got, want)
