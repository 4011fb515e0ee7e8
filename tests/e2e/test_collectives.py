"""Collectives on the 4x4x4 mesh, against CPU JAX on 64 host devices.

One program per group of mesh axes holds every collective over those axes; every output is
laid out with each chip's local result side by side (EVERY_CHIP), so each chip's value is
compared, not only one copy.

Tolerances: float sums may add in another order than XLA on CPU does (the simulator adds
in the order of a ring algorithm): e2e_reference's FLOAT_RTOL. Everything else (max, min,
integers, bools, gathers, all_to_all, ppermute) must be exact.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_trn2
from e2e_reference import assert_matches, random_array, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))
NAMES = MESH[1]
EVERY_CHIP = P(NAMES)  # dim 0 split over all axes: chip by chip, in logical device order

AXIS_GROUPS = [
    "x", "y", "z",
    ("x", "y"), ("y", "x"), ("x", "z"), ("z", "x"), ("y", "z"), ("z", "y"),
    ("x", "y", "z"), ("z", "x", "y"),
]


def as_tuple(axes) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes)


def group_size(axes) -> int:
    return math.prod(MESH[0][NAMES.index(a)] for a in as_tuple(axes))


def axes_id(axes) -> str:
    return "".join(as_tuple(axes))


def per_chip(rng, local_shape, dtype="float32") -> np.ndarray:
    """A global operand whose every chip holds its own block of `local_shape`."""
    return random_array(rng, (64 * local_shape[0],) + tuple(local_shape[1:]), dtype)


def replicated_along(axes, rng, local_shape, dtype="float32"):
    """(operand, in_spec) of a value that varies along the other mesh axes only."""
    others = tuple(a for a in NAMES if a not in as_tuple(axes))
    count = math.prod(MESH[0][NAMES.index(a)] for a in others)
    shape = (count * local_shape[0],) + tuple(local_shape[1:])
    return rng.standard_normal(shape).astype(dtype), P(others or None)


@pytest.mark.parametrize("axes", AXIS_GROUPS, ids=axes_id)
def test_collectives_over_axes(axes, rng):
    g = group_size(axes)
    args = {
        "f32": per_chip(rng, (2, 3)),
        "i32": per_chip(rng, (2, 3), "int32"),
        "i8": per_chip(rng, (2, 3), "int8"),
        "u32": per_chip(rng, (2, 3), "uint32"),
        "bool": per_chip(rng, (2, 3), "bool"),
        "scatter0": per_chip(rng, (g, 2)),
        "scatter1": per_chip(rng, (2, g), "int32"),
        "square": per_chip(rng, (g, g)),
    }
    specs = {k: EVERY_CHIP for k in args}
    args["replicated"], specs["replicated"] = replicated_along(axes, rng, (2, 3))
    args["replicated_g"], specs["replicated_g"] = replicated_along(axes, rng, (g, 2))

    def body(a):
        return {
            "psum": lax.psum(a["f32"], axes),
            "psum_i32": lax.psum(a["i32"], axes),
            "psum_u32": lax.psum(a["u32"], axes),
            "pmax": lax.pmax(a["f32"], axes),
            "pmin": lax.pmin(a["f32"], axes),
            "pmax_i8": lax.pmax(a["i8"], axes),
            "pmin_i32": lax.pmin(a["i32"], axes),
            "any": lax.pmax(a["bool"], axes),  # jax's or of bools over chips
            "all": lax.pmin(a["bool"], axes),
            "psum_tuple": jnp.stack(lax.psum((a["f32"], 2 * a["f32"]), axes)),
            "psum_replicated": lax.psum(a["replicated"], axes),
            "pmax_replicated": lax.pmax(a["replicated"], axes),
            "gather": lax.all_gather(a["f32"], axes),
            "gather_axis1": lax.all_gather(a["i8"], axes, axis=1),
            "gather_tiled": lax.all_gather(a["f32"], axes, tiled=True),
            "gather_tiled_axis1": lax.all_gather(a["bool"], axes, axis=1, tiled=True),
            "gather_replicated": lax.all_gather(a["replicated"], axes, tiled=True),
            "scatter_replicated": lax.psum_scatter(a["replicated_g"], axes, tiled=True),
            "all_to_all_replicated": lax.all_to_all(a["replicated_g"], axes, 0, 1,
                                                    tiled=True),
            "scatter_tiled": lax.psum_scatter(a["scatter0"], axes, tiled=True),
            "scatter_untiled": lax.psum_scatter(a["scatter0"], axes)[None],
            "scatter_dim1": lax.psum_scatter(a["scatter1"], axes, scatter_dimension=1,
                                             tiled=True),
            "all_to_all_0_1": lax.all_to_all(a["square"], axes, 0, 1, tiled=True),
            "all_to_all_1_0": lax.all_to_all(a["square"], axes, 1, 0, tiled=True),
            "all_to_all_1_1": lax.all_to_all(a["square"], axes, 1, 1, tiled=True),
            "all_to_all_untiled": lax.all_to_all(a["square"], axes, 0, 0),
            "axis_index": lax.axis_index(axes)[None],
        }

    got, want = run_both(body, *MESH, (specs,), EVERY_CHIP, args)
    float_sums = {k for k in got if k.startswith(("psum", "scatter")) and
                  np.asarray(want[k]).dtype == np.float32}
    assert_matches({k: got[k] for k in float_sums}, {k: want[k] for k in float_sums})
    assert_matches({k: v for k, v in got.items() if k not in float_sums},
                   {k: v for k, v in want.items() if k not in float_sums}, exact=True)


@pytest.mark.parametrize("axis", NAMES)
def test_ppermute_rings_and_partial_permutations(axis, rng):
    n = MESH[0][NAMES.index(axis)]
    forward = [(i, (i + 1) % n) for i in range(n)]
    backward = [(i, (i - 1) % n) for i in range(n)]
    partial = [(0, 2), (3, 0)]  # chips 1 and 3 receive nothing: zeros
    x = per_chip(rng, (2, 3))
    replicated, spec = replicated_along(axis, rng, (2, 3))

    def body(x, r):
        return {
            "forward": lax.ppermute(x, axis, forward),
            "backward": lax.ppermute(x, axis, backward),
            "partial": lax.ppermute(x, axis, partial),
            "swap_pairs": lax.ppermute(x, axis, [(0, 1), (1, 0), (2, 3), (3, 2)]),
            "replicated_forward": lax.ppermute(r, axis, forward),
            "replicated_partial": lax.ppermute(r, axis, partial),
        }

    got, want = run_both(body, *MESH, (EVERY_CHIP, spec), EVERY_CHIP, x, replicated)
    assert_matches(got, want, exact=True)


def test_ppermute_over_several_axes(rng):
    """Permutations of the 16 (x, y) positions that are not shifts along one axis: a ring
    through all of them, and one that moves along x by a distance that depends on y (so
    a value that varies along x only arrives varying along y too)."""
    ring = [(i, (i + 5) % 16) for i in range(16)]
    skew = [(4 * x + y, 4 * ((x + y) % 4) + y) for x in range(4) for y in range(4)]
    partial = [(0, 15), (15, 1), (6, 9)]
    x = per_chip(rng, (2, 3))
    along_x = rng.standard_normal((4 * 2, 3)).astype(np.float32)

    def body(x, u):
        return {
            "ring_xy": lax.ppermute(x, ("x", "y"), ring),
            "ring_zx": lax.ppermute(x, ("z", "x"), ring),
            "skew": lax.ppermute(u, ("x", "y"), skew),
            "skew_partial": lax.ppermute(u, ("x", "y"), partial),
            "all_axes": lax.ppermute(x, NAMES, [(i, (7 * i + 3) % 64) for i in range(64)]),
        }

    got, want = run_both(body, *MESH, (EVERY_CHIP, P("x")), EVERY_CHIP, x, along_x)
    assert_matches(got, want, exact=True)


def test_axis_index_of_each_axis_and_tuples():
    def body():
        names = [*NAMES, ("x", "y"), ("z", "x"), ("y", "z", "x"), NAMES]
        return {axes_id(a): lax.axis_index(a)[None] for a in names}

    got, want = run_both(body, *MESH, (), EVERY_CHIP)
    assert_matches(got, want, exact=True)


def test_bf16_psum_within_the_error_bound_of_any_order(rng):
    """BF16 partial sums are rounded to BF16 at every step (they travel between chips in
    BF16), in an order XLA on CPU need not share. Any order of k - 1 rounded additions is
    within (k - 1) * u * sum(|x_i|) of the exact sum (u = 2**-8, half a BF16 ulp at 1), so
    the simulated psum is checked against that bound around the float64 sum."""
    x = per_chip(rng, (2, 8), "bfloat16")
    groups = ["x", ("y", "z"), NAMES]
    sim, _ = run_both(lambda x: {axes_id(a): lax.psum(x, a) for a in groups},
                      *MESH, EVERY_CHIP, EVERY_CHIP, x)
    chips = x.astype(np.float64).reshape(4, 4, 4, 2, 8)
    for axes in groups:
        got = sim[axes_id(axes)]
        dims = tuple(NAMES.index(a) for a in as_tuple(axes))
        exact = np.broadcast_to(chips.sum(dims, keepdims=True), chips.shape)
        bound = (group_size(axes) - 1) * 2.0 ** -8 * np.broadcast_to(
            np.abs(chips).sum(dims, keepdims=True), chips.shape)
        error = np.abs(np.asarray(got).astype(np.float64).reshape(chips.shape) - exact)
        assert (error <= bound).all(), (axes, float((error - bound).max()))


def test_axis_index_groups(rng):
    """jax's axis_index_groups give groups that are not lines of the mesh."""
    pairs = [[0, 1], [2, 3]]
    crossed = [[0, 3], [1, 2]]
    x = per_chip(rng, (2, 4))

    def body(x):
        return {
            "psum_pairs": lax.psum(x, "x", axis_index_groups=pairs),
            "pmax_crossed": lax.pmax(x, "y", axis_index_groups=crossed),
            "gather_crossed": lax.all_gather(x, "z", axis_index_groups=crossed),
            "all_to_all_pairs": lax.all_to_all(x, "x", 1, 1, axis_index_groups=pairs,
                                               tiled=True),
            "scatter_crossed": lax.psum_scatter(x, "y", axis_index_groups=crossed,
                                                tiled=True),
        }

    got, want = run_both(body, *MESH, EVERY_CHIP, EVERY_CHIP, x, check_vma=False)
    assert_matches(got, want)


# all_reduce bodies jax does not emit (it reduces bools with maximum/minimum), written as
# StableHLO: (body op, element type) -> numpy reduction over the group's members.
BITWISE_REDUCTIONS = {
    ("and", "i1"): np.logical_and.reduce, ("or", "i1"): np.logical_or.reduce,
    ("xor", "i1"): np.logical_xor.reduce, ("add", "i1"): np.logical_or.reduce,
    ("multiply", "i1"): np.logical_and.reduce, ("and", "i32"): np.bitwise_and.reduce,
    ("or", "i32"): np.bitwise_or.reduce, ("xor", "i32"): np.bitwise_xor.reduce,
}


def all_reduce_module(reductions, groups: np.ndarray) -> str:
    """A shard_map-style module: every chip's [4, 3] block, one all_reduce per reduction
    over `groups`, each chip's results side by side."""
    local = {"i1": "tensor<4x3xi1>", "i32": "tensor<4x3xi32>"}
    whole = {"i1": "tensor<256x3xi1>", "i32": "tensor<256x3xi32>"}
    every_chip = '<@mesh, [{"x", "y", "z"}, {}]>'
    group_text = f"dense<{groups.tolist()}> : tensor<{groups.shape[0]}x{groups.shape[1]}xi64>"
    results = ", ".join(whole[t] for _, t in reductions)
    body = []
    for k, (op, t) in enumerate(reductions):
        arg = "%b" if t == "i1" else "%i"
        body.append(f"""
      %{k} = "stablehlo.all_reduce"({arg}) <{{channel_handle = #stablehlo.channel_handle<
          handle = {k + 1}, type = 1>, replica_groups = {group_text}, use_global_device_ids}}> ({{
      ^bb0(%p: tensor<{t}>, %q: tensor<{t}>):
        %s = stablehlo.{op} %p, %q : tensor<{t}>
        stablehlo.return %s : tensor<{t}>
      }}) : ({local[t]}) -> {local[t]}""")
    returned = ", ".join(f"%{k}" for k in range(len(reductions)))
    return f"""
module @bitwise attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  sdy.mesh @mesh = <["x"=4, "y"=4, "z"=4]>
  func.func public @main(%arg0: tensor<256x3xi1>, %arg1: tensor<256x3xi32>) -> ({results}) {{
    %r:{len(reductions)} = sdy.manual_computation(%arg0, %arg1)
        in_shardings=[{every_chip}, {every_chip}]
        out_shardings=[{", ".join([every_chip] * len(reductions))}]
        manual_axes={{"x", "y", "z"}} (%b: tensor<4x3xi1>, %i: tensor<4x3xi32>) {{{"".join(body)}
      sdy.return {returned} : {", ".join(local[t] for _, t in reductions)}
    }} : ({whole["i1"]}, {whole["i32"]}) -> ({results})
    return {", ".join(f"%r#{k}" for k in range(len(reductions)))} : {results}
  }}
}}"""


@pytest.mark.parametrize("axes", [(1,), (0, 2)], ids=["y", "xz"])
def test_all_reduce_bitwise_and_boolean_bodies(axes, rng):
    """and/or/xor of bools and integers, and StableHLO's add/multiply of bools (logical
    or/and), over groups along mesh axes."""
    ids = np.arange(64).reshape(4, 4, 4)
    rest = [a for a in range(3) if a not in axes]
    groups = np.transpose(ids, rest + list(axes)).reshape(-1, 4 ** len(axes))
    reductions = list(BITWISE_REDUCTIONS)
    executable = jax_trn2.client().compile(all_reduce_module(reductions, groups))
    bools = rng.random((256, 3)) < 0.5
    ints = rng.integers(0, 2 ** 31 - 1, (256, 3)).astype(np.int32)
    outs = executable.execute([bools, ints])
    chips = {"i1": bools.reshape(4, 4, 4, 4, 3), "i32": ints.reshape(4, 4, 4, 4, 3)}
    for (op, t), out in zip(reductions, outs):
        want = BITWISE_REDUCTIONS[(op, t)](chips[t], axis=axes, keepdims=True)
        np.testing.assert_array_equal(np.asarray(out).reshape(chips[t].shape),
                                      np.broadcast_to(want, chips[t].shape), err_msg=(op, t))


def test_collectives_inside_called_functions(rng):
    """A jitted helper becomes a func.call, here called twice and calling another."""
    @jax.jit
    def normalise(v):
        return v / lax.psum(jnp.abs(v), "x")

    @jax.jit
    def step(v):
        return lax.ppermute(normalise(v), "z", [(i, (i + 1) % 4) for i in range(4)])

    x = per_chip(rng, (2, 3))
    got, want = run_both(lambda v: (step(v), normalise(2 * v)), *MESH, EVERY_CHIP,
                         EVERY_CHIP, x)
    assert_matches(got, want)
