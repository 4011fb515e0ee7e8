"""The executor over several devices takes each argument as its devices' chips read it
(mesh.executor.read_sharding): an input the mesh axis the devices split the chips along
cuts into blocks comes in those blocks, and no device gathers the others' (over several
processes: no process receives the others' parts); one every chip reads whole comes whole.
Results go where a caller asks (split_covering): split so each device holds what it
needs, else whole."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_trn2
from mesh import executor, sharding

RNG = np.random.default_rng(0)
BATCH = 512  # rows of the batch: its arrays hold more elements than either weight's


def _train_step():
    """A data-parallel (4) x tensor-parallel (4) step: the batch split over 'data', the
    weights over 'model' and replicated over 'data'."""
    mesh = jax_trn2.make_mesh((4, 4), ("data", "model"))

    def loss(params, x, y):
        h = jax.nn.relu(jnp.dot(x, params["w1"], preferred_element_type=jnp.float32))
        return jnp.mean((jnp.dot(h.astype(jnp.bfloat16), params["w2"],
                                 preferred_element_type=jnp.float32) - y) ** 2)

    def step(params, x, y):
        value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: (p - 0.01 * g).astype(p.dtype), params, grads), value

    weights = {"w1": NamedSharding(mesh, P(None, "model")),
               "w2": NamedSharding(mesh, P("model", None))}
    batch = NamedSharding(mesh, P("data"))
    params = {"w1": (RNG.standard_normal((128, 256)) * 0.1).astype(jnp.bfloat16),
              "w2": (RNG.standard_normal((256, 128)) * 0.1).astype(jnp.bfloat16)}
    x = RNG.standard_normal((BATCH, 128)).astype(jnp.bfloat16)
    y = RNG.standard_normal((BATCH, 128)).astype(np.float32)
    return step, (weights, batch, batch), (weights, NamedSharding(mesh, P())), (params, x, y)


def test_each_device_takes_the_blocks_its_chips_read_and_gathers_none():
    step, in_shardings, out_shardings, args = _train_step()
    devices = jax.devices()[:2]
    spread = jax_trn2.jit(step, in_shardings=in_shardings, out_shardings=out_shardings,
                          executor_devices=devices)
    executable = spread.lower(*args).compile().executable
    # (params w1, w2, x, y) the batch in blocks of rows ('data' splits it, and the devices
    # split the chips along 'data'); the weights, which every chip along 'data' reads, whole
    specs = [s.spec for s in executable.argument_shardings]
    assert specs == [P(None, None), P(None, None), P("executor", None), P("executor", None)]
    # what a call runs: no device gathers the batch (XLA may still gather a conversion of
    # a weight it split the work of, which every device held whole anyway)
    gathered = [math.prod(map(int, shape.split(","))) for shape in re.findall(
        r"= \w+\[([\d,]+)\]\S* all-gather\(", executable._run_global.compiled.as_text())]
    assert all(size < BATCH * 128 for size in gathered), gathered
    one = jax_trn2.jit(step, in_shardings=in_shardings, out_shardings=out_shardings)(*args)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(spread(*args))):
        a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
        assert a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_an_input_a_chip_reads_whole_is_whole_on_every_device():
    mesh = jax_trn2.make_mesh((4, 4), ("data", "model"))
    f = jax.shard_map(lambda a: a * 2, mesh=mesh, in_specs=P("model", "data"),
                      out_specs=P("model", "data"))  # 'data' splits dim 1, not first
    a = RNG.standard_normal((64, 64)).astype(np.float32)
    executable = jax_trn2.jit(f, executor_devices=jax.devices()[:2]).lower(a).compile() \
        .executable
    assert executable.argument_shardings[0].spec == P(None, "executor")  # dim 1's blocks
    g = jax.shard_map(lambda a: a * 2, mesh=mesh, in_specs=P("model", None),
                      out_specs=P("model", None))  # every chip along 'data' reads it all
    executable = jax_trn2.jit(g, executor_devices=jax.devices()[:2]).lower(a).compile() \
        .executable
    assert executable.argument_shardings[0].spec == P(None, None)


def test_results_split_where_each_device_holds_what_it_needs_else_whole():
    devices = jax.devices()[:2]
    shape = (4, 2, 8)
    rows = [[(slice(0, 2), slice(None), slice(None))], [(slice(2, 4), slice(0, 1))]]
    assert executor.split_covering(devices, shape, rows).spec == P("executor", None, None)
    across = [[(slice(0, 3), slice(None), slice(None))],  # not in halves of any axis
              [(slice(3, 4), slice(None), slice(None))]]
    assert executor.split_covering(devices, shape, across).spec == P(None, None, None)
    last = [[(slice(None), slice(None), slice(0, 4))], [(slice(None), slice(None), slice(4, 8))]]
    assert executor.split_covering(devices, shape, last).spec == P(None, None, "executor")
    assert executor.split_covering(devices, shape, last, within=2).spec == P(None, None, None)


def test_regions_of_blocks_and_chips():
    shape, layout, sizes = (8, 6), ((0,), (1,)), (2, 3)
    regions = sharding.block_regions(shape, layout, sizes)
    assert sharding.bounds(regions[4], shape) == [(4, 8), (2, 4)]
    assert sharding.contains((slice(4, 8), slice(None)), regions[4], shape)
    assert not sharding.contains((slice(0, 4), slice(None)), regions[4], shape)
    assert sharding.overlap(regions[0], regions[4], shape) is None
    part = (slice(2, 6), slice(0, 6))
    common = sharding.overlap(regions[4], part, shape)
    assert sharding.bounds(common, shape) == [(4, 6), (2, 4)]
    assert sharding.region_size(common, shape) == 4
    assert sharding.bounds(sharding.relative(common, part, shape), shape) == [(2, 4), (2, 4)]
    chips = sharding.chip_regions((2, 1, 5), sizes)  # pieces that do not vary along axis 1
    assert sharding.bounds(chips[4], (2, 1, 5)) == [(1, 2), (0, 1), (0, 5)]
