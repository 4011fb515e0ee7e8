"""Helpers for end-to-end tests: run one shard_map program through jax_trn2.jit and
through jax.jit on CPU host devices, and compare."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType

import jax_trn2
from mesh.executor import EXECUTOR_COMPILER_OPTIONS
from mesh.machine import device_order, get_topology, place_mesh

# Tolerances, relative to the largest reference magnitude, where the two runs may add in a
# different order: FP32 re-association changes a sum of n terms by up to ~n*eps*sum|x|
# (eps = 2**-24; the programs here add at most a few hundred terms, so 2**-14 covers it).
# BF16/FP16 results are rounded once from FP32 sums that may differ in their last FP32 bits,
# so the two results may round to neighbouring values: 2 ulps of the output type.
FLOAT_RTOL = {
    "float32": 2.0 ** -14,
    "bfloat16": 2 * 2.0 ** -7,
    "float16": 2 * 2.0 ** -10,
    # FP8 results are likewise rounded once (2 ulps); CPU JAX's FP8 dots round twice
    # (FP32 -> FP16 -> FP8), which stays within the same 2 ulps.
    "float8_e4m3fn": 2 * 2.0 ** -3,
    "float8_e4m3": 2 * 2.0 ** -3,
    "float8_e5m2": 2 * 2.0 ** -2,
    "float8_e3m4": 2 * 2.0 ** -4,
}


def cpu_mesh(shape: tuple[int, ...], names: tuple[str, ...]):
    devices = jax.devices("cpu")[: math.prod(shape)]
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=devices)


def trn2_mesh(shape: tuple[int, ...], names: tuple[str, ...], topology: str = "trn2-ultra"):
    """A mesh of the trn2 plugin's devices (jax.devices('trn2')), placed on the torus as
    jax_trn2.make_mesh places it."""
    topo = get_topology(topology)
    placement = place_mesh(topo, tuple(shape), tuple(names), None)
    order, devices = device_order(topo), jax.devices("trn2")  # device i: order[i]
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape),
                         devices=[devices[order.index(d)] for d in placement.device_ids])


def run_both(body, shape, names, in_specs, out_specs, *args, topology="trn2-ultra",
             check_vma=True):
    """(simulated result, CPU reference) of shard_map(body) over a mesh of `shape`; the
    simulated result through both front doors, jax_trn2.jit and plain jax.jit on the trn2
    plugin's devices, which must agree bit for bit."""
    sim_mesh = jax_trn2.make_mesh(shape, names, topology=topology)
    ref_mesh = cpu_mesh(shape, names)
    sim = jax_trn2.jit(jax.shard_map(body, mesh=sim_mesh, in_specs=in_specs,
                                     out_specs=out_specs, check_vma=check_vma))
    # The reference rounds every op's result to its type, as StableHLO says and the
    # simulator does (by default XLA on CPU may keep BF16 intermediates in FP32).
    ref = jax.jit(jax.shard_map(body, mesh=ref_mesh, in_specs=in_specs,
                                out_specs=out_specs, check_vma=check_vma),
                  compiler_options=EXECUTOR_COMPILER_OPTIONS)
    got = sim(*args)
    assert_same_bits(run_plain(body, shape, names, in_specs, out_specs, *args,
                               topology=topology, check_vma=check_vma), got)
    return got, ref(*args)


def run_plain(body, shape, names, in_specs, out_specs, *args, topology="trn2-ultra",
              check_vma=True):
    """shard_map(body) through plain jax.jit on the trn2 plugin's devices."""
    return jax.jit(jax.shard_map(body, mesh=trn2_mesh(shape, names, topology),
                                 in_specs=in_specs, out_specs=out_specs, check_vma=check_vma),
                   compiler_options={"trn2_topology": topology})(*args)


def assert_matches(got, want, exact: bool = False) -> None:
    """Exact for integers, bools and data movement; FLOAT_RTOL otherwise."""
    got_leaves, got_tree = jax.tree.flatten(got)
    want_leaves, want_tree = jax.tree.flatten(want)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        # jnp.issubdtype knows ml_dtypes' floats (numpy gives float8_e5m2 kind 'f' but
        # the other FP8 types and bfloat16 kind 'V', and calls none of them inexact)
        if exact or not jnp.issubdtype(w.dtype, jnp.inexact):
            np.testing.assert_array_equal(g, w)
            continue
        wide_g, wide_w = g.astype(np.float64), w.astype(np.float64)
        scale = max(float(np.nanmax(np.abs(wide_w))) if wide_w.size else 0.0, 1e-30)
        rtol = FLOAT_RTOL[w.dtype.name]
        np.testing.assert_allclose(wide_g, wide_w, rtol=rtol, atol=rtol * scale)


def assert_same_bits(got, want) -> None:
    """Equal bit for bit, leaf by leaf: -0.0 differs from +0.0, NaNs are equal only with
    equal bits (for results that only move data or are defined bit for bit)."""
    def bits(x):
        x = np.asarray(x)
        return x.view(f"uint{x.dtype.itemsize * 8}")
    assert_matches(jax.tree.map(bits, got), jax.tree.map(bits, want), exact=True)


def random_array(rng, shape, dtype):
    """Values that exercise the type: normals for floats, a spread of ints, random bools."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


