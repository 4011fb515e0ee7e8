"""The same programs through both front doors: jax_trn2.jit and plain jax.jit on
jax.devices('trn2') run one simulator and must agree bit for bit (and with CPU JAX)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from tests.e2e.e2e_reference import assert_matches, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))


def _scan(xs):
    def step(carry, x):
        carry = carry + jax.lax.psum(x, "y")
        return carry, carry * 2
    return jax.lax.scan(step, jnp.zeros_like(xs[0]), xs)


PROGRAMS = {
    "psum_matmul": (lambda a, b: jax.lax.psum(a @ b, "y"), (P("x", "y"), P("y", None)),
                    P("x", None), [(64, 32), (32, 16)], np.float32),
    "bf16_matmul": (lambda a, b: jax.lax.psum(a @ b, "y"), (P("x", "y"), P("y", None)),
                    P("x", None), [(64, 256), (256, 32)], jnp.bfloat16),
    "ppermute": (lambda a: jax.lax.ppermute(a, "x", [(i, (i + 1) % 4) for i in range(4)]),
                 (P("x"),), P("x"), [(16, 8)], np.float32),
    "psum_scatter": (lambda a: jax.lax.psum_scatter(a, "y", tiled=True), (P(),), P("y"),
                     [(16, 8)], np.float32),
    "scan_psum": (_scan, (P(None, "x"),), (P("x"), P(None, "x")), [(4, 32, 8)], np.float32),
}


@pytest.mark.parametrize("body, in_specs, out_specs, shapes, dtype", PROGRAMS.values(),
                         ids=PROGRAMS.keys())
def test_both_front_doors_agree(body, in_specs, out_specs, shapes, dtype, rng):
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    got, want = run_both(body, *MESH, in_specs, out_specs, *args)  # both front doors agree
    assert_matches(got, want)
