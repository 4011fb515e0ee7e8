"""The layouts of a program's parameters and results: given by jax's mhlo.layout_mode, or
chosen for `auto` as XLA:CPU chooses them (tests/jax_trn2/plugin/test_buffer_layouts.py
compares them with XLA:CPU's)."""

import jax
import numpy as np
from jax.experimental.layout import Format, Layout

from lowering import memory_layouts, mlir

X = jax.ShapeDtypeStruct((4, 8), np.float32)


def layouts(f, in_layout, out_layout):
    """main_layouts of jax's module of jit(f) with these in and out layouts, on one CPU
    device."""
    device = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    step = jax.jit(f, in_shardings=Format(in_layout, device),
                   out_shardings=Format(out_layout, device))
    return memory_layouts.main_layouts(mlir.parse_module(step.lower(X).as_text()))


def test_default_and_concrete_layouts_are_taken_as_given():
    assert layouts(lambda x: x.T, None, None) == ([(0, 1)], [(0, 1)])
    assert layouts(lambda x: x * 2, Layout((1, 0)), Layout((0, 1))) == ([(1, 0)], [(0, 1)])


def test_auto_results_keep_the_memory_order_through_transposes_and_elementwise_ops():
    assert layouts(lambda x: x.T, Layout.AUTO, Layout.AUTO) == ([(0, 1)], [(1, 0)])
    assert layouts(lambda x: (jax.numpy.sin(x).T + 1).T * 2, Layout.AUTO, Layout.AUTO) == \
        ([(0, 1)], [(0, 1)])
    assert layouts(lambda x: (x @ x.T), Layout.AUTO, Layout.AUTO) == ([(0, 1)], [(0, 1)])


def test_a_layout_constraint_gives_its_layout():
    def f(x):
        device = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        return jax.lax.with_sharding_constraint(x * 2, Format(Layout((1, 0)), device))

    assert layouts(f, Layout.AUTO, Layout.AUTO) == ([(0, 1)], [(1, 0)])
