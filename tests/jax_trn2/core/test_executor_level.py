"""The executor's computation of a program whose float ops all round once, exactly (here:
none, random integers) is compiled at LLVM level 2 (mesh.optimization_level), and gives
the CPU's bits."""

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mesh import optimization_level


def test_random_integers_over_a_mesh_compile_at_level_2_and_match_the_cpu(monkeypatch):
    chosen, choose = [], optimization_level.compiler_options

    def spied(module):
        options = choose(module)
        chosen.append(options)
        return options

    monkeypatch.setattr(optimization_level, "compiler_options", spied)
    devices = jax.devices("trn2")[:4]
    mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 2), ("x", "y"))
    on_mesh = NamedSharding(mesh, P("x", "y"))

    def integers(seed):  # threefry's integer rounds
        return jax.random.randint(jax.random.key(seed), (8, 12), -5, 1000)

    got = jax.jit(integers, out_shardings=on_mesh)(np.uint32(11))
    want = jax.jit(integers)(jax.device_put(np.uint32(11), jax.devices("cpu")[0]))
    assert chosen == [{"xla_backend_optimization_level": optimization_level.EXACT_LEVEL}]
    assert got.sharding == on_mesh
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want), strict=True)
