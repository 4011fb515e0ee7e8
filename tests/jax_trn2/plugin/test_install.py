"""The plugin as a user meets it, each check in a fresh Python process: found by jax after
a (non-editable) install, chosen with JAX_PLATFORMS, its programs in jax's persistent
compilation cache, and a clean exit."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def run(code: str, cwd: Path, **env) -> str:
    """Run `code` in a fresh interpreter of this environment; its output (stdout + stderr).
    The process must exit cleanly (jaxlib's destructors run after ctypes' callbacks die)."""
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                            text=True, timeout=300, env={**os.environ, **env})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


PROGRAM = """
import jax, numpy as np
x = jax.device_put(np.arange(8.0, dtype=np.float32), jax.devices("trn2")[2])
y = jax.jit(lambda v: v * 2 + 1)(x)
print("result", np.asarray(y).tolist(), y.devices())
"""


def test_non_editable_install_is_discovered(tmp_path):
    """`pip install .` builds the C shim; jax discovers the plugin by its entry point."""
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(ROOT)], check=True, timeout=600)
    shim = list((target / "jax_trn2" / "plugin").glob("_shim*.so"))
    assert shim, "the install built no C shim"
    out = run("import jax_trn2.plugin as p; print('from', p.library_path())" + PROGRAM,
              tmp_path, PYTHONPATH=str(target))
    assert f"from {target}" in out
    assert "result [1.0, 3.0, 5.0, 7.0, 9.0, 11.0, 13.0, 15.0]" in out


def test_jax_platforms_selects_the_simulator(tmp_path):
    out = run("import jax, jax.numpy as jnp; print(jax.devices()[0].device_kind, "
              "jax.default_backend(), (jnp.arange(4) + 1).tolist())", tmp_path,
              JAX_PLATFORMS="trn2")
    assert "Trainium2 neuron [1, 2, 3, 4]" in out


def test_a_program_without_arguments_or_results_under_jax_platforms(tmp_path):
    """jax runs a shard_map not under jit op by op: a scan whose carry is all forwarded is
    a program with neither arguments nor results, whose simulation has no sharding to
    place it by; it must still run on the simulator's own CPU client, not on jax's
    default backend (the plugin itself)."""
    code = ("import jax, jax.numpy as jnp\n"
            "from jax.sharding import PartitionSpec as P\n"
            "mesh = jax.sharding.Mesh(jax.devices()[:2], ('x',))\n"
            "def g(x):\n"
            "    (c,), _ = jax.lax.scan(lambda c, _: (c, None), (x.sum(),), None, length=1)\n"
            "    return c[None]\n"
            "f = jax.shard_map(g, mesh=mesh, in_specs=P('x'), out_specs=P('x'))\n"
            "print('result', f(jnp.arange(4.0)).tolist())\n")
    out = run(code, tmp_path, JAX_PLATFORMS="trn2")
    assert "result [1.0, 5.0]" in out


def test_host_callbacks_under_jax_platforms_with_the_cpu(tmp_path):
    """The README's setting for host callbacks with the simulator as the default."""
    code = ("import jax, jax.numpy as jnp\n"
            "f = lambda x: jax.pure_callback(lambda a: a + 1, jax.ShapeDtypeStruct((3,), "
            "jnp.int32), x)\n"
            "y = jax.jit(f)(jnp.arange(3))\n"
            "print(jax.default_backend(), y.tolist(), y.devices())\n")
    out = run(code, tmp_path, JAX_PLATFORMS="trn2,cpu")
    assert "neuron [1, 2, 3] {Trn2Device(id=0" in out


def test_client_options_choose_the_topology(tmp_path):
    out = run("import jax; d = jax.devices('trn2'); print(len(d), d[-1].coords)", tmp_path,
              JAX_TRN2_TOPOLOGY="trn2")
    assert "16 [3, 3]" in out


def test_persistent_compilation_cache_hits(tmp_path):
    cache = tmp_path / "cache"
    code = ("import jax, logging; logging.basicConfig(level=logging.DEBUG); "
            "jax.config.update('jax_compilation_cache_dir', %r); "
            "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0); "
            "jax.config.update('jax_persistent_cache_min_entry_size_bytes', -1)" % str(cache)
            ) + PROGRAM
    first = run(code, tmp_path)
    assert any(cache.iterdir()), first
    second = run(code, tmp_path)
    assert "Persistent compilation cache hit" in second
    assert "result [1.0, 3.0, 5.0" in second


def test_package_names_survive_importing_their_submodules_first(tmp_path):
    """jax_trn2's names load lazily (jax imports the plugin at backend start-up): importing
    the modules behind them first leaves them as they are, and the public modules import
    by their public names too."""
    out = run("from jax_trn2.frontend.jit import Jitted; import jax_trn2.core.client; "
              "import jax_trn2.plan; from jax_trn2.serving import serve; import jax_trn2; "
              "print(callable(jax_trn2.jit), callable(jax_trn2.client), "
              "jax_trn2.numerics.__name__, jax_trn2.plan.sweep.__module__, serve.__module__)",
              ROOT)
    assert "True True jax_trn2.reports.numerics jax_trn2.planner.plan " \
           "jax_trn2.planner.serving" in out


def test_exit_after_an_ordered_effect_is_clean(tmp_path):
    """jax waits at exit for an ordered effect's runtime token (after the plugin's own exit
    handler): it must find the token ready, not a deleted buffer, and print nothing."""
    code = ("import jax, jax.numpy as jnp\n"
            "def f(x):\n"
            "    jax.debug.print('x={x}', x=x, ordered=True)\n"
            "    return x + 1\n"
            "print('result', jax.jit(f)(jnp.ones(2)).tolist())\n")
    out = run(code, tmp_path, JAX_PLATFORMS="trn2,cpu")
    assert out == "x=[1. 1.]\nresult [2.0, 2.0]\n", out
