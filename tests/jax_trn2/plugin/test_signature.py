"""The optimized program the plugin hands jaxlib (jax_trn2.plugin.signature): one device's
signature, from which jax reads the output shardings and layouts."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((4, 2), ("x", "y"), devices=jax.devices("trn2")[:8],
                         axis_types=(AxisType.Auto,) * 2)


def _entry_layout(text: str) -> str:
    return re.search(r"entry_computation_layout=\{(.*?)\}, allow_spmd", text).group(1)


def test_compiled_text_has_each_devices_shapes(mesh):
    """As an SPMD compiler's module (and `compiled.as_text()` of XLA's): a parameter split
    4 x 2 ways is one device's 4 x 3 piece, a result replicated keeps its shape, one split
    over "y" only is halved; the shardings say how the pieces make the global values."""
    x = jax.device_put(np.arange(16 * 6, dtype=np.float32).reshape(16, 6),
                       NamedSharding(mesh, P("x", "y")))
    t = jnp.zeros((4,), jnp.int32, device=NamedSharding(mesh, P()))
    shardings = (NamedSharding(mesh, P("x", "y")), NamedSharding(mesh, P()),
                 NamedSharding(mesh, P("y")))
    f = jax.jit(lambda a, t: (a * 2, a.sum(0), t + 1), out_shardings=shardings)
    compiled = f.lower(x, t).compile()
    text = compiled.as_text()
    assert _entry_layout(text) == \
        "(f32[4,3]{1,0}, s32[4]{0})->(f32[4,3]{1,0}, f32[6]{0}, s32[2]{0})"
    assert "f32[16,6]" not in text
    assert "sharding={devices=[4,2]<=[8]}" in text
    assert [s.spec for s in compiled.output_shardings] == [P("x", "y"), P(), P("y")]
    assert [f.sharding.spec for f in compiled.input_formats[0]] == [P("x", "y"), P()]
    assert [f.layout.major_to_minor for f in compiled.output_formats] == [(0, 1), (0,), (0,)]
    a, total, u = f(x, t)
    assert a.addressable_shards[0].data.shape == (4, 3) and u.sharding.spec == P("y")
    np.testing.assert_array_equal(np.asarray(total), np.asarray(x).sum(0))


def test_a_partitioned_programs_text_is_the_partitioners(mesh):
    """A program XLA's partitioner partitions: its optimized program is the per-chip module
    the simulator runs, with the collectives the partitioner inserted (as XLA:CPU's)."""
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("x", "y")))
    f = jax.jit(lambda a: a.sum(0), out_shardings=NamedSharding(mesh, P()))
    text = f.lower(x).compile().as_text()
    assert _entry_layout(text) == "(f32[2,2]{1,0})->f32[4]{0}"
    assert "all-reduce(" in text and "all-gather(" in text


def test_shard_map_programs_give_each_devices_shapes(mesh):
    """A shard_map program (run as it is, not partitioned by XLA): its parameters and
    results are the in_specs' and out_specs' pieces."""
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "y"), mesh=mesh,
                              in_specs=P("x", "y"), out_specs=P("x")))
    x = jax.device_put(np.ones((8, 4), np.float32), NamedSharding(mesh, P("x", "y")))
    compiled = f.lower(x).compile()
    assert _entry_layout(compiled.as_text()) == "(f32[2,2]{1,0})->f32[2,2]{1,0}"
    assert compiled.output_shardings.spec == P("x")
    np.testing.assert_array_equal(np.asarray(f(x)), np.full((8, 2), 2.0, np.float32))


def test_eager_ops_keep_a_sharding_over_a_mesh_with_axes_of_size_1():
    """jax reads an eager op's result sharding from the optimized program: over a mesh
    (1, 8, 1) it is the argument's."""
    mesh = jax.make_mesh((1, 8, 1), ("x", "y", "z"), devices=jax.devices("trn2")[:8],
                         axis_types=(AxisType.Auto,) * 3)
    x = jax.device_put(jnp.arange(32).reshape(1, -1, 1), NamedSharding(mesh, P("x", "y", "z")))
    assert (x + 1).sharding == x.sharding


def test_a_program_named_with_a_hyphen_gives_its_shardings(mesh):
    """jax names an eager primitive's program after it (`jit_scatter-add`), a name MLIR
    must quote: over several devices, its result's sharding is read from the signature."""
    z = jax.device_put(np.zeros(6, np.int32), NamedSharding(mesh, P()))
    w = z.at[np.array([0, 1])].add(1)
    assert w.sharding == NamedSharding(mesh, P())
    scatter = jax.jit(lambda a: a.at[np.array([0, 1])].add(1)).lower(z).compile()
    assert scatter.output_shardings == NamedSharding(mesh, P())
    np.testing.assert_array_equal(w - 1, [0, 0, -1, -1, -1, -1])


def test_a_compile_makes_no_optimized_program_and_the_text_keeps_each_programs_types(
        monkeypatch):
    """jaxlib learns a compiled program's shardings from PJRT's shardings extension, so a
    compile converts no module (milliseconds a program for jaxlib's converter);
    `as_text()` makes the optimized program then. Programs whose text is their signature
    alone (with tokens, an ordered effect's) each show their own shapes, dtypes and
    results."""
    from jax.experimental import io_callback
    from jax_trn2.plugin import signature
    made = []
    monkeypatch.setattr(signature, "signature_module",
                        lambda *a, make=signature.signature_module: made.append(1) or make(*a))
    device = jax.devices("trn2")[0]

    def compiled(scale, shape=(8, 4), dtype=np.float32, twice=False):
        x = jax.device_put(np.ones(shape, dtype), device)

        def f(a):
            io_callback(lambda _: None, None, a, ordered=True)  # tokens in and out
            return (a * scale, a + scale) if twice else a * scale
        return jax.jit(f).lower(x).compile(), x

    first, x = compiled(2)
    np.testing.assert_array_equal(np.asarray(first(x)), np.full((8, 4), 2.0, np.float32))
    assert first.output_shardings == jax.sharding.SingleDeviceSharding(device)
    assert not made
    assert _entry_layout(first.as_text()) == \
        "(pred[0]{0}, f32[8,4]{1,0})->(pred[0]{0}, f32[8,4]{1,0})"
    assert len(made) == 1
    for (shape, dtype, twice), layout in [
            (((16, 4), np.float32, False), "f32[16,4]{1,0})->(pred[0]{0}, f32[16,4]{1,0})"),
            (((8, 4), np.int32, False), "s32[8,4]{1,0})->(pred[0]{0}, s32[8,4]{1,0})"),
            (((8, 4), np.float32, True),
             "f32[8,4]{1,0})->(pred[0]{0}, f32[8,4]{1,0}, f32[8,4]{1,0})")]:
        other, x = compiled(3, shape, dtype, twice)
        assert _entry_layout(other.as_text()).endswith(layout)
        assert len(jax.tree.leaves(other(x))) == (2 if twice else 1)
