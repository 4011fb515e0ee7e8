"""mesh.numerics: rounding policies, stochastic rounding, FP8 edge cases per format, and the
order in which ring collectives add (mesh.isa.kernels.ring_order)."""

import jax
import jax.numpy as jnp
from jax import lax
import ml_dtypes
import numpy as np
import pytest

from mesh import isa, numerics
from mesh.executor import compile_program
from mesh.isa.kernels import ring_order
from mesh.isa.kernels.ring_order import SELECT_MAX_RING, ring_orders, ring_reduce

NARROW = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4")
FP8 = NARROW[2:]
ALL_ONES = np.uint32(0xFFFF_FFFF)
stochastic_round = jax.jit(numerics.stochastic_round, static_argnums=1)


def dtype(name):
    return np.dtype(np.float16 if name == "float16" else getattr(ml_dtypes, name))


def sample_values(name, rng, n=4000):
    """FP32 values of both signs, log-uniform from below the format's smallest subnormal up
    to its largest finite value (inclusive of FP32 subnormals for bfloat16)."""
    info = ml_dtypes.finfo(dtype(name))
    lo, hi = np.log2(float(info.smallest_subnormal)) - 3, np.log2(float(info.max))
    mags = np.minimum(2.0 ** rng.uniform(lo, hi, n), float(info.max)).astype(np.float32)
    return np.where(rng.random(n) < 0.5, -mags, mags).astype(np.float32)


def toward_zero(x, name):
    """The format's value nearest x with |value| <= |x| (x finite, |x| <= max)."""
    r = x.astype(dtype(name))
    too_far = np.abs(r.astype(np.float64)) > np.abs(x.astype(np.float64))
    r[too_far] = np.nextafter(r[too_far], np.zeros_like(r[too_far]))
    return r


def away_from_zero(x, name):
    """The format's value nearest x with |value| >= |x| (x finite, |x| <= max)."""
    dt = dtype(name)
    r = x.astype(dt)
    short = np.abs(r.astype(np.float64)) < np.abs(x.astype(np.float64))
    big = np.where(x > 0, ml_dtypes.finfo(dt).max, -ml_dtypes.finfo(dt).max).astype(dt)
    r[short] = np.nextafter(r[short], big[short])
    return r


def stochastic(x, name, bits):
    return np.asarray(stochastic_round(jnp.asarray(x), name,
                                                jnp.broadcast_to(jnp.uint32(bits), x.shape)))


def same_values(got, want):
    """Equal as values of the format, NaN matching NaN, signed zeros matching."""
    g, w = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    return (g == w) & (np.signbit(g) == np.signbit(w)) | np.isnan(g) & np.isnan(w)


# --- the policy --------------------------------------------------------------------------

def test_unknown_rounding_mode_lists_the_modes():
    with pytest.raises(ValueError, match="'chop'.*'nearest', 'stochastic'"):
        numerics.Rounding("chop")


@pytest.mark.parametrize("seed", [-1, 2**32, 1.5, True])
def test_bad_seed_is_rejected(seed):
    with pytest.raises(ValueError, match="seed"):
        numerics.Rounding("stochastic", seed)


def test_nearest_has_no_hook_and_stochastic_a_fresh_one_per_trace():
    assert numerics.NEAREST.rounder() is None
    policy = numerics.Rounding("stochastic", 3)
    assert policy.rounder() is not policy.rounder()


# --- stochastic rounding of single values ------------------------------------------------

@pytest.mark.parametrize("name", NARROW)
def test_all_ones_random_bits_round_toward_zero(name, rng):
    # The random number is never below the distance to the upper neighbour: always down.
    x = sample_values(name, rng)
    assert same_values(stochastic(x, name, ALL_ONES), toward_zero(x, name)).all()


@pytest.mark.parametrize("name", NARROW)
def test_zero_random_bits_round_away_from_zero(name, rng):
    # Zero is below any non-zero distance: every inexact value goes up (away from zero).
    x = sample_values(name, rng)
    assert same_values(stochastic(x, name, 0), away_from_zero(x, name)).all()


@pytest.mark.parametrize("name", NARROW)
def test_representable_values_are_kept(name, rng):
    x = sample_values(name, rng).astype(dtype(name)).astype(np.float32)
    bits = rng.integers(0, 2**32, x.shape, dtype=np.uint64).astype(np.uint32)
    got = stochastic_round(jnp.asarray(x), name, jnp.asarray(bits))
    assert same_values(got, x).all()


@pytest.mark.parametrize("name", NARROW)
def test_stochastic_rounding_is_unbiased(name):
    info = ml_dtypes.finfo(dtype(name))
    tiny, big = float(info.smallest_subnormal), float(info.max)
    # Below the smallest subnormal, in the subnormals, normal of both signs, near the max.
    x = np.array([0.3 * tiny, 2.7 * tiny, 1 + 0.3 * float(info.eps), -3.3, 0.97 * big],
                 np.float32)
    samples = 20_000
    bits = jax.random.bits(jax.random.key(0), (samples, x.size), jnp.uint32)
    got = np.asarray(stochastic_round(jnp.broadcast_to(jnp.asarray(x), bits.shape),
                                               name, bits)).astype(np.float64)
    down = toward_zero(x, name).astype(np.float64)
    up = away_from_zero(x, name).astype(np.float64)
    assert ((got == down) | (got == up)).all()
    step = np.abs(up - down)
    p_up = np.abs(x - down) / step
    # The mean of `samples` draws of a two-point variable with spread `step`: its standard
    # deviation is step * sqrt(p (1 - p) / samples); 5 sigma leaves ~1e-6 false failures.
    sigma = step * np.sqrt(p_up * (1 - p_up) / samples)
    assert (np.abs(got.mean(axis=0) - x) <= 5 * sigma).all(), (got.mean(axis=0), x, sigma)


@pytest.mark.parametrize("name", NARROW)
def test_nonfinite_values_convert_as_nearest_does(name):
    x = np.array([np.nan, -np.nan, np.inf, -np.inf], np.float32)
    got = stochastic(x, name, 0)
    assert same_values(got, x.astype(dtype(name))).all()


@pytest.mark.parametrize("name", NARROW)
def test_values_above_the_largest_finite_overflow_with_their_probability(name):
    info = ml_dtypes.finfo(dtype(name))
    big = float(info.max)
    step = float(2.0 ** (np.floor(np.log2(big)) - info.nmant))
    x = np.float32(big + 0.25 * step)  # a quarter of the way to the next grid point
    samples = 20_000
    bits = jax.random.bits(jax.random.key(1), (samples,), jnp.uint32)
    got = np.asarray(stochastic_round(jnp.full(samples, x), name, bits))
    with np.errstate(over="ignore"):
        overflow = np.float32(big + step).astype(dtype(name))  # inf, or NaN for e4m3fn
    overflowed = same_values(got, np.full(samples, overflow))
    assert (overflowed | (got.astype(np.float64) == big)).all()
    # Bernoulli(1/4) frequency over 20000 draws: sigma = sqrt(3/16 / 20000) ~ 0.0031.
    assert abs(overflowed.mean() - 0.25) <= 5 * np.sqrt(0.25 * 0.75 / samples)


# --- through the executor: conversions and FP8 edges ---------------------------------------

def run_elementwise(op, in_dtypes, out_dtype, *args, rounding=numerics.NEAREST):
    """One Elementwise instruction on a mesh-less program, compiled by the executor."""
    shape = np.shape(args[0])
    values = {i: isa.ValueInfo(isa.TensorType(shape, d)) for i, d in enumerate(in_dtypes)}
    out = len(in_dtypes)
    values[out] = isa.ValueInfo(isa.TensorType(shape, out_dtype))
    program = isa.Program(isa.MeshSpec((), ()),
                          (isa.Elementwise((out,), tuple(range(out)), op=op),),
                          tuple(range(out)), (out,), values)
    (result,) = compile_program(program, rounding)(*[jnp.asarray(a) for a in args])
    return np.asarray(result)


def edge_values(name):
    """FP32 values at each format's edges: zeros, subnormal ties, the largest finite value
    and the ties and overflow beyond it, infinities and NaN."""
    info = ml_dtypes.finfo(dtype(name))
    tiny, big = float(info.smallest_subnormal), float(info.max)
    step = 2.0 ** (np.floor(np.log2(big)) - info.nmant)  # spacing at the largest binade
    values = [0.0, -0.0, tiny, 0.5 * tiny, 0.75 * tiny, 1.5 * tiny, 2.5 * tiny,
              float(info.smallest_normal) * (1 - 2.0 ** -10), big, big + 0.5 * step,
              big + 0.499 * step, big + step, 2 * big, 1e30, np.inf, -np.inf, np.nan,
              1e-45, -big - 0.5 * step]
    with np.errstate(over="ignore"):
        return np.array(values, np.float32)


@pytest.mark.parametrize("name", NARROW)
def test_convert_matches_ml_dtypes_at_the_edges(name):
    x = edge_values(name)
    got = run_elementwise("convert", ["float32"], name, x)
    with np.errstate(over="ignore"):
        want = x.astype(dtype(name))
    assert got.dtype == dtype(name)
    assert same_values(got, want).all(), (x, got, want)


@pytest.mark.parametrize("name, overflow", [("float8_e4m3fn", np.nan), ("float8_e5m2", np.inf),
                                            ("float8_e4m3", np.inf), ("float8_e3m4", np.inf)])
def test_fp8_overflow_per_format(name, overflow):
    # e4m3fn has no infinity: StableHLO/XLA (and ml_dtypes) give NaN; the others give inf.
    big = float(ml_dtypes.finfo(dtype(name)).max)
    got = run_elementwise("convert", ["float32"], name, np.array([4 * big, -4 * big, np.inf],
                                                                 np.float32))
    assert same_values(got, np.array([overflow, -overflow, overflow])).all()


@pytest.mark.parametrize("name", FP8)
def test_fp8_arithmetic_overflow_nan_and_subnormals(name):
    info = ml_dtypes.finfo(dtype(name))
    big, tiny = info.max, info.smallest_subnormal
    dt = dtype(name)
    a = np.array([big, np.nan, tiny, tiny, 3 * tiny, -tiny], dt)
    b = np.array([big, 1, 0.5, 1.5, 0.5, 0.5], dt)
    got = run_elementwise("multiply", [name, name], name, a, b)
    with np.errstate(over="ignore"):
        want = (a.astype(np.float32) * b.astype(np.float32)).astype(dt)
    # big*big overflows (NaN for e4m3fn, inf otherwise); NaN propagates; tiny/2 ties to 0,
    # 1.5*tiny ties to the even 2*tiny, 1.5*tiny ... (3*tiny)/2 to 2*tiny; -tiny/2 to -0.
    assert same_values(got, want).all(), (got, want)
    assert np.isnan(got[1])
    assert got[2] == 0 and got[3] == 2 * tiny and np.signbit(got[5])


def test_stochastic_program_is_reproducible_for_a_seed_and_differs_across_seeds(rng):
    x = (1 + rng.random((64, 64)) * 2.0 ** -7).astype(np.float32)  # inexact in bfloat16

    def run(seed):
        return run_elementwise("convert", ["float32"], "bfloat16", x,
                               rounding=numerics.Rounding("stochastic", seed))

    first = run(0)
    np.testing.assert_array_equal(first, run(0))  # a new compilation, the same bits
    assert (first != run(1)).mean() > 0.2  # P(differ) = 2 p (1 - p), ~0.33 on average here


def test_rounding_sites_draw_different_bits():
    # Two conversions of the same values in one program: different sites, different bits.
    x = np.full((32, 32), 1 + 2.0 ** -9, np.float32)  # a quarter of a BF16 ulp above 1
    values = {0: isa.ValueInfo(isa.TensorType(x.shape, "float32")),
              1: isa.ValueInfo(isa.TensorType(x.shape, "bfloat16")),
              2: isa.ValueInfo(isa.TensorType(x.shape, "bfloat16"))}
    program = isa.Program(isa.MeshSpec((), ()),
                          (isa.Elementwise((1,), (0,), op="convert"),
                           isa.Elementwise((2,), (0,), op="convert")), (0,), (1, 2), values)
    first, second = compile_program(program, numerics.Rounding("stochastic", 0))(x)
    assert (np.asarray(first) != np.asarray(second)).any()


# --- ring collectives --------------------------------------------------------------------

@pytest.mark.parametrize("sizes, n", [((4,), 8), ((4,), 10), ((4, 4), 48), ((2, 3), 7)])
def test_each_element_visits_every_member_and_ends_at_its_owner(sizes, n):
    orders = ring_orders(sizes, n)
    block = -(-n // int(np.prod(sizes)))
    owner = np.unravel_index(np.arange(n) // block, sizes)
    for order, k, coord in zip(orders, sizes, owner):
        assert order.shape == (k, n)
        assert (np.sort(order, axis=0) == np.arange(k)[:, None]).all()
        np.testing.assert_array_equal(order[-1], coord)


def test_bidirectional_ring_sends_the_halves_of_a_chunk_opposite_ways():
    (order,) = ring_orders((4,), 8)  # two elements per chunk: one each way
    np.testing.assert_array_equal(order[:, 0], [1, 2, 3, 0])  # chunk 0, first half
    np.testing.assert_array_equal(order[:, 1], [3, 2, 1, 0])  # chunk 0, second half
    np.testing.assert_array_equal(order[:, 6], [0, 1, 2, 3])  # chunk 3, first half


def sequential_fold(values, order):
    """values [k, n] bfloat16, order [k, n]: each column added in its order, every partial
    rounded to bfloat16 (the ring's arithmetic, written out element by element)."""
    out = np.empty(values.shape[1], values.dtype)
    for e in range(values.shape[1]):
        acc = values[order[0, e], e]
        for s in range(1, values.shape[0]):
            acc = (np.float32(acc) + np.float32(values[order[s, e], e])).astype(values.dtype)
        out[e] = acc
    return out


@pytest.mark.parametrize("k", [4, 16])  # a select per step; a gather per step (long rings)
def test_ring_reduce_adds_in_ring_order_with_rounded_partials(rng, k):
    # Magnitudes spread over 2**12 make BF16 partial sums depend on the order.
    n = 6 * k
    values = (rng.standard_normal((k, n)) * 2.0 ** rng.integers(0, 12, (k, n))
              ).astype(ml_dtypes.bfloat16)
    got = np.asarray(ring_reduce(jnp.asarray(values), 0, (k,), lax.add, None))
    (order,) = ring_orders((k,), n)
    np.testing.assert_array_equal(got, sequential_fold(values, order))
    assert (got != sequential_fold(values, np.tile(np.arange(k)[:, None], (1, n)))).any()


@pytest.mark.parametrize("k", [4, 16])
def test_a_long_rings_steps_are_one_loop_but_with_stochastic_rounding(k):
    """A ring longer than SELECT_MAX_RING compiles its step once (a loop over the steps),
    unless each step is a stochastic rounding site of its own."""
    values = jnp.zeros((k, 2 * k), jnp.bfloat16)

    def text(rounding):
        return jax.jit(lambda v: ring_reduce(v, 0, (k,), lax.add, rounding)).lower(
            values).as_text()

    assert ("stablehlo.while" in text(None)) == (k > SELECT_MAX_RING)
    assert "stablehlo.while" not in text(lambda x, name: x.astype(name))


@pytest.mark.parametrize("axis_order", [(0, 1), (1, 0)])
def test_two_axis_rings_reduce_one_axis_after_the_other(rng, axis_order):
    ka, kb, n = 2, 3, 12
    values = (rng.standard_normal((ka, kb, n)) * 2.0 ** rng.integers(0, 12, (ka, kb, n))
              ).astype(ml_dtypes.bfloat16)
    got = np.asarray(ring_reduce(jnp.asarray(values), 0, (ka, kb), lax.add, None,
                                 axis_order))
    orders = ring_orders((ka, kb), n)
    first, second = axis_order
    partial = np.stack([sequential_fold(np.take(values, i, axis=second), orders[first])
                        for i in range((ka, kb)[second])])
    np.testing.assert_array_equal(got, sequential_fold(partial, orders[second]))


@pytest.mark.parametrize("sizes, n", [((4,), 10), ((2, 3), 7), ((4, 4), 3), ((3,), 0),
                                      ((2, 3), 12), ((16,), 32), ((8,), 8), ((8,), 24),
                                      ((2, 4), 40), ((3, 2, 2), 12), ((4, 2), 16),
                                      ((2, 16), 64)])
@pytest.mark.parametrize("gathered", [True, False], ids=["gathered", "selected"])
def test_blocks_and_leading_dims_keep_the_ring_order(rng, sizes, n, gathered, monkeypatch):
    """Short last blocks (n not a multiple of the members), owners with nothing to own,
    whole blocks (laid out as [owner, position], one or an odd number of positions each:
    each step's members gathered as constant rows when the buffer is small, else selected;
    a ring of 16 gathers its members in a loop, after or without a ring that did not),
    and leading dims that are not reduced."""
    if not gathered:
        monkeypatch.setattr(ring_order, "GATHERED_MAX_ELEMENTS", 0)
    shape = (2,) + sizes + (n,)
    values = (rng.standard_normal(shape) * 2.0 ** rng.integers(0, 12, shape)
              ).astype(ml_dtypes.bfloat16)
    got = np.asarray(ring_reduce(jnp.asarray(values), 1, sizes, lax.add, None))
    for lead in range(2):
        partial = values[lead]
        for order in ring_orders(sizes, n):  # major axis first
            partial = _fold_axis(partial, order)
        np.testing.assert_array_equal(got[lead], partial)


def _fold_axis(values, order):
    """Fold the leading member dim of [k, rest..., n] in `order` ([k, n]), rest kept."""
    k, n = values.shape[0], values.shape[-1]
    rest = values.shape[1:-1]
    flat = values.reshape(k, int(np.prod(rest, dtype=np.int64)), n)
    out = np.stack([sequential_fold(flat[:, r], order) for r in range(flat.shape[1])])
    return out.reshape(rest + (n,))


def test_a_value_replicated_along_the_ring_is_added_to_itself():
    x = np.array([1 + 2.0 ** -7, 3 + 2.0 ** -6], ml_dtypes.bfloat16)  # 3x is inexact
    got = np.asarray(ring_reduce(jnp.asarray(x)[None], 0, (4,), lax.add, None))
    want = x
    for _ in range(3):
        want = (want.astype(np.float32) + x.astype(np.float32)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got, want)
