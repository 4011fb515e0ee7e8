"""jax_trn2.inspect: a program plain jax.jit compiled for the trn2 devices gets
jax_trn2.Compiled's listing, estimates, trace and plot."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2


def layer(x, w):
    return jnp.tanh(x @ w)


@pytest.fixture(scope="module")
def arguments():
    mesh = jax.make_mesh((4,), ("data",), devices=jax.devices("trn2")[:4],
                         axis_types=(AxisType.Auto,))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 128)).astype(np.float32)
    w = rng.standard_normal((128, 128)).astype(np.float32)
    return (jax.device_put(x, NamedSharding(mesh, P("data"))),
            jax.device_put(w, NamedSharding(mesh, P())))


@pytest.fixture(scope="module")
def compiled(arguments):
    return jax.jit(layer).lower(*arguments).compile()


def test_inspect_gives_a_jax_trn2_compiled_with_the_plugins_estimates(compiled):
    study = jax_trn2.inspect(compiled)
    assert isinstance(study, jax_trn2.Compiled)
    assert study.as_text() == jax_trn2.listing(compiled)
    assert "estimated step time per chip on trn2-ultra (4 of its 64 chips)" in study.as_text()
    cost = study.cost_analysis()
    # jax's numbers come through PJRT's named values, as float32
    assert cost["optimal_seconds"] == pytest.approx(
        compiled.cost_analysis()["optimal_seconds"], rel=2 ** -23)
    assert cost["optimal_seconds"] > 0
    assert cost["trn2"]["chips"] == 64
    assert study.memory_analysis().peak_memory_in_bytes == \
        compiled.memory_analysis().peak_memory_in_bytes


def test_inspected_program_draws_its_plot_and_writes_its_trace(compiled, tmp_path):
    study = jax_trn2.inspect(compiled)
    study.plot(tmp_path / "step.png")
    assert (tmp_path / "step.png").read_bytes().startswith(b"\x89PNG")
    # the chips of the mesh's first two devices (device ids put the x ring innermost:
    # device 1 is chip 16, at (1, 0, 0))
    study.save_trace(tmp_path / "step.json", chips=[0, 16])
    events = json.loads((tmp_path / "step.json").read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 16}
    assert any(e["name"] == "Matmul" for e in events)


def test_inspected_program_runs_and_shards_as_jaxs(compiled, arguments):
    study = jax_trn2.inspect(compiled)
    np.testing.assert_array_equal(np.asarray(study(*arguments)),
                                  np.asarray(compiled(*arguments)))
    assert study.output_shardings == compiled.output_shardings
    assert study.input_shardings == compiled.input_shardings
    assert study.args_info == compiled.args_info


def test_a_jax_trn2_compiled_is_its_own_inspection():
    ours = jax_trn2.jit(layer).lower(jax.ShapeDtypeStruct((8, 8), jnp.float32),
                                     jax.ShapeDtypeStruct((8, 8), jnp.float32)).compile()
    assert jax_trn2.inspect(ours) is ours


def test_inspect_refuses_what_is_not_a_trn2_compiled_program(arguments):
    x = np.ones((4, 4), np.float32)
    on_cpu = jax.jit(layer).lower(x, x).compile()
    with pytest.raises(ValueError, match=r"not a program compiled by the trn2 plugin \(it was "
                                         r"compiled for the cpu platform\)"):
        jax_trn2.inspect(on_cpu)
    with pytest.raises(TypeError, match="takes a compiled program.*got a function"):
        jax_trn2.inspect(layer)
    with pytest.raises(TypeError, match=r"got a lowered program: compile it first"):
        jax_trn2.inspect(jax.jit(layer).lower(*arguments))
