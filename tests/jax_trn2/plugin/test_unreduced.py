"""Unreduced values through the plugin: arrays whose devices each hold a different partial
sum (jax's P(unreduced=...)), one buffer of its own per device, as on XLA:CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2


def _mesh(devices):
    return jax.make_mesh((2, 2), ("x", "y"), devices=devices[:4],
                         axis_types=(AxisType.Explicit,) * 2)


def _partial_sums(mesh):
    """An einsum left unreduced along "x": each device sums its own rows."""
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.arange(16.0).reshape(4, 4), P("x", "y"))
        f = jax.jit(lambda v: jnp.einsum("ab->b", v, out_sharding=P("y", unreduced={"x"})))
        return f, x, f(x)


def test_unreduced_results_hold_each_devices_partial_sum():
    trn2, cpu = _mesh(jax.devices("trn2")), _mesh(jax.devices("cpu"))
    f, x, ours = _partial_sums(trn2)
    _, _, want = _partial_sums(cpu)
    assert ours.sharding == NamedSharding(trn2, P("y", unreduced={"x"}))
    assert [s.data.shape for s in ours.addressable_shards] == [(2,)] * 4
    for got, expected in zip(ours.addressable_shards, want.addressable_shards):
        np.testing.assert_array_equal(np.asarray(got.data), np.asarray(expected.data))
    # the per-device program: each device's partial sum, no all-reduce
    with jax.set_mesh(trn2):
        compiled = f.lower(x).compile()
    assert "->f32[2]{0}" in compiled.as_text() and "all-reduce" not in compiled.as_text()
    assert compiled.output_shardings.spec == P("y", unreduced={"x"})


def test_unreduced_arguments_are_reduced_by_the_program_that_reshards_them():
    _, _, ours = _partial_sums(_mesh(jax.devices("trn2")))
    with jax.set_mesh(ours.sharding.mesh):
        np.testing.assert_array_equal(np.asarray(jax.reshard(ours, P())),
                                      np.arange(16.0).reshape(4, 4).sum(0))
        again = jax.jit(lambda v: jax.reshard(v, P("y")))(ours)  # a second program
        assert again.sharding.spec == P("y")
        np.testing.assert_array_equal(np.asarray(again), [24.0, 28.0, 32.0, 36.0])


def test_shard_map_unreduced_in_and_out_specs():
    """A shard_map's out_specs P(unreduced=...) keeps each device's value; its in_specs
    P(unreduced=...) gives each device its own, as the gradient of a reduced value does."""
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices("trn2")[:2],
                         axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        arr = jax.device_put(np.arange(4, dtype=np.int32), P("x"))
        partial = jax.jit(jax.shard_map(lambda v: v, in_specs=P("x"),
                                        out_specs=P(unreduced={"x"})))(arr)
        assert partial.sharding.spec == P(None, unreduced={"x"})
        assert [np.asarray(s.data).tolist() for s in partial.addressable_shards] == \
            [[0, 1], [2, 3]]
        summed = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "x"),
                                       in_specs=P(unreduced={"x"}), out_specs=P()))(partial)
        np.testing.assert_array_equal(np.asarray(summed), [2, 4])
        reduced = jax.device_put(np.arange(8.0, dtype=np.float32), P(reduced={"x"}))
        f = jax.shard_map(lambda v: jax.lax.pcast(v, "x", to="varying"), out_specs=P("x"))
        grad = jax.grad(lambda v: f(v).sum())(reduced)
        assert grad.sharding.spec == P(None, unreduced={"x"})
        np.testing.assert_array_equal(np.asarray(jax.reshard(grad, P())), np.full(8, 2.0))


def test_jax_trn2_jit_refuses_unreduced_values_by_name():
    mesh = jax_trn2.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
        x = jax.device_put(np.ones((4, 4), np.float32), P("x", "y"))
        f = jax_trn2.jit(lambda v: jnp.einsum("ab->b", v, out_sharding=P("y", unreduced={"x"})))
        with pytest.raises(NotImplementedError, match=r"jax_trn2.jit does not take or give "
                                                      r"unreduced values"):
            f(x)


def _each_devices_own(devices):
    """A shard_map that check_vma=False lets return each device's own value as a result
    its out_specs replicate, from an unreduced value and from a sharded one."""
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=devices[:4],
                         axis_types=(AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
        arr = jax.device_put(np.arange(8, dtype=np.int32), P("x"))
        partial = jax.jit(jax.shard_map(lambda v: v, in_specs=P("x"),
                                        out_specs=P(unreduced={"x"})))(arr)
        from_partial = jax.jit(jax.shard_map(lambda v: v, in_specs=P(unreduced={"x"}),
                                             out_specs=P(), check_vma=False))(partial)
        from_pieces = jax.jit(jax.shard_map(lambda v: v * 2, in_specs=P("x"),
                                            out_specs=P(), check_vma=False))(arr)
        return [[np.asarray(s.data).tolist() for s in out.addressable_shards]
                for out in (from_partial, from_pieces)]


def test_results_replicated_by_out_specs_keep_each_devices_own_value():
    """XLA keeps each device's buffer as its program computed it, where the result's
    sharding says the devices hold copies; the plugin used to give every device the value
    of the first device along the replicated axis."""
    ours = _each_devices_own(jax.devices("trn2"))
    assert ours == _each_devices_own(jax.devices("cpu"))
    assert ours[0] == [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]]



def _accumulated_gradients(devices):
    """jax's minibatch loop: the gradients of three weights accumulated unreduced over a
    scan, then reduced once; the step and its result."""
    mesh = jax.make_mesh((2,), ("x",), devices=devices[:2], axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
        def model(ws, xs):
            for w in ws:
                xs = jnp.tanh(xs @ w)
            return xs.sum()

        @jax.jit
        def step(ws, xs):
            def body(acc, batch):
                return jax.tree.map(jnp.add, acc, jax.grad(model)(ws, batch)), None
            acc = jax.reshard(jax.tree.map(jnp.zeros_like, ws), P(unreduced={"x"}))
            acc, _ = jax.lax.scan(body, acc, xs)
            return jax.tree.map(lambda w, g: w - 0.01 * g, jax.reshard(ws, P()),
                                jax.reshard(acc, P()))

        rng = np.random.default_rng(0)
        ws = tuple(jax.device_put(rng.standard_normal((4, 4), np.float32), P(reduced={"x"}))
                   for _ in range(3))
        xs = jax.device_put(rng.standard_normal((2, 2, 4), np.float32), P(None, "x", None))
        return step.lower(ws, xs).compile(), step(ws, xs)


def test_the_gradients_all_reduces_are_combined_into_one():
    """The partitioner's all-reduce per gradient is one all-reduce of them all, as XLA's
    combiner makes on XLA:CPU, with the same values."""
    compiled, ours = _accumulated_gradients(jax.devices("trn2"))
    _, want = _accumulated_gradients(jax.devices("cpu"))
    assert compiled.as_text().count("all-reduce(") == 1
    for got, expected in zip(ours, want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6)
