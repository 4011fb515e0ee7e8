"""Costs are the user's: a Flax model's instructions are named by its module path and the
user's source line (not the library line that made the op, not an absolute path), through
jax_trn2.jit and through plain jax.jit on the plugin's devices."""

import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jax_trn2


class Attention(nn.Module):
    @nn.compact
    def __call__(self, x):
        q = nn.Dense(128, name="q")(x)
        k = nn.Dense(128, name="k")(x)
        return jnp.tanh(q * k)


class Model(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = Attention(name="attn")(x)
        return nn.Dense(128)(x)  # Dense_0


MODEL = Model()
SOURCE = Path(__file__).read_text().splitlines()


def user_line(text: str) -> str:
    """`test_sites.py:21`: the line of this file that holds `text`, as the costs name it
    (its path relative to the working directory ends so)."""
    return f"test_sites.py:{next(i for i, line in enumerate(SOURCE, 1) if text in line)}"


def loss(params, x):
    return jnp.sum(MODEL.apply(params, x) ** 2)


@pytest.fixture(scope="module", params=["jax_trn2.jit", "jax.jit"])
def door(request):
    """The gradient step of the model, data parallel over 4 chips, compiled through either
    door: what the user holds (a jax_trn2.Compiled, or jax's Compiled)."""
    x = np.ones((512, 128), np.float32)
    params = MODEL.init(jax.random.PRNGKey(0), x)
    if request.param == "jax_trn2.jit":
        mesh, jit = jax_trn2.make_mesh((4,), ("data",)), jax_trn2.jit
    else:
        mesh, jit = jax.make_mesh((4,), ("data",), devices=jax.devices("trn2")[:4],
                                  axis_types=(AxisType.Auto,)), jax.jit
    x = jax.device_put(x, NamedSharding(mesh, P("data")))
    params = jax.device_put(params, NamedSharding(mesh, P()))
    return jit(jax.grad(loss)).lower(params, x).compile()


@pytest.fixture(scope="module")
def compiled(door):
    """The step as a jax_trn2.Compiled (what jax_trn2.inspect makes of jax's)."""
    return door if isinstance(door, jax_trn2.Compiled) else jax_trn2.inspect(door)


def all_keys(tree) -> list[str]:
    if not isinstance(tree, dict):
        return []
    return [k for key, value in tree.items() for k in [key, *all_keys(value)]]


def test_critical_path_is_split_by_module_path(compiled):
    scopes = compiled.cost_analysis()["trn2"]["critical_path_by_scope"]
    assert {"Model/attn/q", "Model/attn/k", "Model/Dense_0"} <= set(scopes)
    assert scopes["Model/attn/q"] > 0 and scopes["Model/Dense_0"] > 0


def test_critical_path_names_the_users_lines_not_the_librarys(compiled):
    lines = compiled.cost_analysis()["trn2"]["critical_path_by_source"]
    for text in ('name="q"', 'name="k"', "Dense_0"):  # each Dense's matmuls: their callers'
        assert sum(s for line, s in lines.items() if line.endswith(user_line(text))) > 0
    assert not any("flax" in line for line in lines)


def test_no_key_holds_an_absolute_or_site_packages_path(door):
    keys = all_keys(door.cost_analysis())  # jax's Compiled: flat, `trn2.critical_path...`
    assert not [k for k in keys if "site-packages" in k or k.startswith("/")]


def test_listing_shows_scope_user_line_and_library_line(compiled):
    matmuls = [line for line in compiled.as_text().splitlines() if ".Matmul(" in line]
    q = user_line('name="q"') + " (via flax/linen/linear.py:"
    assert any("# Model/attn/q " in line and q in line for line in matmuls)
    assert "site-packages" not in compiled.as_text()


def test_trace_events_are_named_by_scope(compiled, tmp_path):
    compiled.save_trace(tmp_path / "step.json", chips=[0])
    events = json.loads((tmp_path / "step.json").read_text())["traceEvents"]
    matmuls = [e for e in events if e.get("name", "").endswith("Matmul")]
    assert "Model/attn/q Matmul" in {e["name"] for e in matmuls}
    assert all("site-packages" not in json.dumps(e["args"]) for e in matmuls)
