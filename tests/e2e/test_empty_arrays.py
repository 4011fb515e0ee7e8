"""Zero-size operands through every collective and data-movement kernel, as CPU JAX does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_trn2

RING = [(i, (i + 1) % 4) for i in range(4)]

# name: (body, in_specs, out_specs); the operand is x of the parametrised shape, split over
# "a" along rows (and "b" along columns where the spec says so)
COLLECTIVES = {
    "psum": (lambda x: lax.psum(x, "b"), P("a", None), P("a", None)),
    "pmax_both_axes": (lambda x: lax.pmax(x, ("a", "b")), P("a", None), P(None, None)),
    "psum_groups": (lambda x: lax.psum(x, "b", axis_index_groups=[[0, 2], [1, 3]]),
                    P("a", None), P("a", None)),
    "all_gather_tiled_dim1": (lambda x: lax.all_gather(x, "b", axis=1, tiled=True),
                              P("a", "b"), P("a", None)),
    "all_gather_stacked": (lambda x: lax.all_gather(x, "b", axis=0), P("a", "b"),
                           P(None, "a", "b")),
    "all_gather_two_axes": (lambda x: lax.all_gather(x, ("a", "b"), tiled=True),
                            P("a", "b"), P(None, "b")),
    "all_to_all": (lambda x: lax.all_to_all(x, "b", 0, 1, tiled=True), P("a", "b"),
                   P("a", "b")),
    "psum_scatter": (lambda x: lax.psum_scatter(x, "b", scatter_dimension=0, tiled=True),
                     P("a", None), P(("a", "b"), None)),
    "ppermute": (lambda x: lax.ppermute(x, "b", RING), P("a", "b"), P("a", "b")),
}

MOVEMENT = {
    "transpose": lambda x: x.T,
    "concatenate": lambda x: jnp.concatenate([x, x, x[:, :0]], axis=1),
    "pad": lambda x: jnp.pad(x, ((1, 2), (0, 1))),
    "slice": lambda x: x[::2, 1:],
    "reverse": lambda x: x[::-1],
    "broadcast": lambda x: jnp.broadcast_to(x, (3,) + x.shape),
    "reshape": lambda x: x.reshape(x.shape[::-1]),
    "gather": lambda x: x[jnp.array([0, 0]) % max(x.shape[0], 1)] if x.shape[0] else x[:0],
    "dynamic_slice": lambda x: lax.dynamic_slice_in_dim(x, 0, 0, axis=0),
    "reduce": lambda x: jnp.sum(x, axis=0),
    "cumsum": lambda x: jnp.cumsum(x, axis=1),
    "sort": lambda x: jnp.sort(x, axis=0),
    "where": lambda x: jnp.where(x > 0, x, -x),
}

SHAPES = [(0, 8), (8, 0), (0, 0)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", COLLECTIVES)
def test_collective_of_an_empty_array(name, shape):
    body, in_spec, out_spec = COLLECTIVES[name]
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    f = jax.shard_map(body, mesh=mesh, in_specs=in_spec, out_specs=out_spec, check_vma=False)
    x = np.zeros(shape, np.float32)
    try:
        want = jax.jit(f)(x)
    except ValueError as e:  # jax refuses some (a zero-size gathered or scattered dim)
        with pytest.raises(ValueError, match=str(e).splitlines()[0][:40].replace("(", r"\(")
                           .replace(")", r"\)")):
            jax_trn2.jit(f)(x)
        return
    got = jax_trn2.jit(f)(x)
    assert got.shape == want.shape and got.dtype == want.dtype


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", MOVEMENT)
def test_data_movement_of_an_empty_array(name, shape):
    f = MOVEMENT[name]
    x = np.zeros(shape, np.float32)
    want = jax.jit(f)(x)
    got = jax_trn2.jit(f)(x)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_an_empty_shard_map_result_is_replicated_as_jax_gives_it():
    """XLA replicates a result with no elements, whatever its out_specs say."""
    f = lambda mesh: jax.shard_map(lambda u: lax.psum(u, "a"), mesh=mesh,  # noqa: E731
                                   in_specs=P(None, "b"), out_specs=P(None, "b"))
    z = np.zeros((0, 8), np.float32)
    cpu = jax.make_mesh((2, 4), ("a", "b"), devices=jax.devices("cpu")[:8],
                        axis_types=(jax.sharding.AxisType.Auto,) * 2)
    got = jax_trn2.jit(f(jax_trn2.make_mesh((2, 4), ("a", "b"))))(z)
    want = jax.jit(f(cpu))(z)
    assert got.sharding.spec == want.sharding.spec == P() and got.shape == (0, 8)
