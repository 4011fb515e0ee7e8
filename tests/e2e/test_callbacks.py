"""Host callbacks run the user's Python function with each chip's own values, as CPU JAX
calls it once per device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.sharding import PartitionSpec as P

import jax_trn2


def printed(capsys, fn, *args):
    """(lines printed by the simulated run, lines printed by CPU JAX) of fn(*args)."""
    jax.block_until_ready(jax_trn2.jit(fn)(*args))
    sim = capsys.readouterr().out.splitlines()
    jax.block_until_ready(jax.jit(fn)(*args))
    jax.effects_barrier()
    ref = capsys.readouterr().out.splitlines()
    return sim, ref


def test_debug_print_in_loops_and_conditionals_prints_what_cpu_jax_prints(capsys):
    def f(x):
        jax.debug.print("x={x}", x=x)

        def body(i, c):
            jax.debug.print("step {i}: {c}", i=i, c=c)
            return c + 1

        total = jax.lax.fori_loop(0, 3, body, x.sum())
        jax.lax.cond(total > 0, lambda: jax.debug.print("positive {t}", t=total),
                     lambda: jax.debug.print("not positive {t}", t=total))
        return total

    sim, ref = printed(capsys, f, jnp.arange(3.0))
    assert sim == ref == ["x=[0. 1. 2.]", "step 0: 3.0", "step 1: 4.0", "step 2: 5.0",
                          "positive 6.0"]


def test_shard_map_body_prints_once_per_chip_in_device_order(capsys):
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))

    def body(x):
        jax.debug.print("chip {i}: {x}", i=jax.lax.axis_index(("a", "b")), x=x)
        return x * 2

    f = jax.shard_map(body, mesh=mesh, in_specs=P(("a", "b")), out_specs=P(("a", "b")))
    sim, ref = printed(capsys, f, jnp.arange(8.0))
    assert sim == [f"chip {i}: [{i}.]" for i in range(8)]
    assert sorted(ref) == sorted(sim)  # CPU JAX's devices print in no fixed order


def test_conditional_that_differs_between_chips_prints_on_the_chips_that_take_it(capsys):
    mesh = jax_trn2.make_mesh((8,), ("i",))

    def body(x):
        i = jax.lax.axis_index("i")
        jax.lax.cond(i % 3 == 0, lambda: jax.debug.print("chip {i} even third", i=i),
                     lambda: None)
        return x

    f = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    sim, ref = printed(capsys, f, jnp.arange(8.0))
    assert sim == ["chip 0 even third", "chip 3 even third", "chip 6 even third"]
    assert sorted(ref) == sim


def test_pure_callback_results_flow_back():
    def f(x):
        y = jax.pure_callback(lambda a: np.sort(np.asarray(a))[::-1].copy(),
                              jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return y * 2 + 1

    x = np.array([3.0, 1.0, 2.0], np.float32)
    np.testing.assert_array_equal(jax_trn2.jit(f)(x), jax.jit(f)(x))


@pytest.mark.parametrize("callback, result", [
    (lambda v: np.asarray(v, np.float64) ** 2, jax.ShapeDtypeStruct((2, 4), jnp.float32)),
    (lambda v: np.argmax(v, axis=1), jax.ShapeDtypeStruct((2,), jnp.int32)),
    (lambda v: float(v.sum()), jax.ShapeDtypeStruct((), jnp.float32)),
    (lambda v: np.asarray(jnp.arange(v.shape[0])), jax.ShapeDtypeStruct((2,), jnp.int32)),
])
def test_callbacks_run_under_the_programs_x64_setting(callback, result):
    """Without jax_enable_x64, jax converts a callback's 64-bit NumPy results to the 32-bit
    types it declared, and jnp inside it makes 32-bit values: as under jax.jit."""
    x = np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4)
    f = lambda a: jax.pure_callback(callback, result, a)  # noqa: E731
    got, want = jax_trn2.jit(f)(x), jax.jit(f)(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_pure_callback_per_chip_in_shard_map():
    mesh = jax_trn2.make_mesh((2, 2), ("a", "b"))

    def body(x):
        return jax.pure_callback(lambda a: np.asarray(a) ** 2 + 1,
                                 jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    f = jax.shard_map(body, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b"))
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(jax_trn2.jit(f)(x), x ** 2 + 1)


def test_ordered_io_callback_runs_in_program_order():
    seen = []

    def f(x):
        io_callback(lambda a: seen.append(("first", float(a))), None, x.sum(), ordered=True)
        io_callback(lambda a: seen.append(("second", float(a))), None, x.max(), ordered=True)
        return x + 1

    np.testing.assert_array_equal(jax_trn2.jit(f)(jnp.arange(4.0)), jnp.arange(4.0) + 1)
    assert seen == [("first", 6.0), ("second", 3.0)]


def test_ordered_effect_with_donation_aliases_the_donated_argument():
    """The token jax passes first for ordered effects is no input: donations count the
    arguments after it (a donated x aliases the x-shaped result)."""
    def f(x, y):
        io_callback(lambda a: None, None, y.sum(), ordered=True)
        return y.sum(), x * 2

    x, y = np.ones((4, 8), np.float32), np.ones((3,), np.float32)
    step = jax_trn2.jit(f, donate_argnums=0)
    assert step.lower(x, y).memory_analysis().alias_size_in_bytes == x.nbytes
    np.testing.assert_array_equal(step(x, y)[1], x * 2)


def test_ordered_io_callback_in_a_loop_carries_its_token_through_the_loop():
    seen = []

    def f(x):
        def step(total, row):
            got = io_callback(lambda r: (seen.append(r.tolist()), r * 2)[1],
                              jax.ShapeDtypeStruct(row.shape, row.dtype), row, ordered=True)
            return total + got.sum(), None

        return jax.lax.scan(step, 0.0, x)[0]

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert float(jax_trn2.jit(f)(x)) == 2 * x.sum()
    assert seen == x.tolist()  # one call per iteration, in order


def test_debug_print_in_an_auto_partitioned_program(capsys):
    """After XLA's partitioner the callback's attributes and (empty, tuple) result are
    spelled as XLA spells them, not as jax emitted them."""
    mesh = jax_trn2.make_mesh((2, 2), ("a", "b"))

    def f(x):
        jax.debug.print("sum {s}", s=x.sum())
        return x * 2

    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    sharded = jax.sharding.NamedSharding(mesh, P("a"))
    out = jax_trn2.jit(f, in_shardings=sharded)(x)
    np.testing.assert_array_equal(out, x * 2)
    assert capsys.readouterr().out.splitlines() == ["sum 28.0"]


def test_listing_shows_the_callback_and_its_round_trip():
    def f(x):
        jax.debug.print("{x}", x=x)
        return x

    text = jax_trn2.jit(f).lower(jnp.ones(4)).compile().as_text()
    assert "DMA.HostCallback(%" in text and "kind=jax.debug.print" in text
    assert "+  100.001" in text  # the stated round trip plus 16 B over PCIe (mesh.perf.cost)


def test_module_without_its_callbacks_names_what_the_user_wrote():
    def f(x):
        jax.debug.print("{x}", x=x)
        return x

    text = jax.jit(f).lower(jnp.ones(4)).as_text(debug_info=True)
    with pytest.raises(jax_trn2.LoweringError, match="jax.debug.print needs its Python "
                                                     "function"):
        jax_trn2.client().compile(text)
