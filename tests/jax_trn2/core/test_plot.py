"""jax_trn2.plot: the step's picture from Compiled.plot and `jax-trn2 inspect --plot`, files
written and well-formed (not pixel-exact), and the link loads it draws."""

import struct
import sys
import xml.etree.ElementTree as ElementTree

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from jax_trn2.core import plot
from jax_trn2.cli import main
from mesh import isa
from mesh.machine import get_topology
from mesh.perf.collectives import link_bytes

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
F32 = jnp.float32


def png_size(path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR" and data.endswith(b"IEND\xaeB`\x82")
    return struct.unpack(">II", data[16:24])


def psum_step(mesh, axis="y", loop=0):
    """A matmul and a psum over `axis` (in a fori_loop of `loop` trips when loop > 0)."""
    def body(a, b):
        out = jnp.dot(a, b, preferred_element_type=F32)
        if loop:
            return jax.lax.fori_loop(0, loop, lambda i, x: jax.lax.psum(x, axis) / 4, out)
        return jax.lax.psum(out, axis)
    # without the varying-axes check, a loop may carry the psum's result as its own input
    return jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P("y", None)),
                                      out_specs=P("x", None), check_vma=not loop))


ARGS = (jax.ShapeDtypeStruct((512, 1024), jnp.bfloat16),
        jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16))


def test_compiled_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "step.png"
    psum_step(jax_trn2.make_mesh()).lower(*ARGS).compile().plot(path)
    width, height = png_size(path)
    assert width == plot.WIDTH_INCHES * 100  # at 100 dpi
    assert 600 <= height <= 1500 and path.stat().st_size > 20_000


def test_plot_takes_its_format_from_the_extension(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "step.svg"
    psum_step(jax_trn2.make_mesh()).lower(*ARGS).compile().plot(path)
    root = ElementTree.parse(path).getroot()
    assert root.tag.endswith("svg")
    text = path.read_text()  # matplotlib notes each text it draws as paths in a comment
    # the picture's parts: engine rows, the HBM peak, a torus panel and its colour scale
    for words in ("Collective ", "peak ", "HBM in use", "z=3", "torus links", "KiB per direction"):
        assert f"<!-- {words}" in text, words


def test_cli_inspect_plot_on_a_faulty_torus(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    mesh = jax.sharding.AbstractMesh((4, 4), ("x", "y"),
                                     axis_types=(jax.sharding.AxisType.Auto,) * 2)
    module = tmp_path / "step.mlir"
    module.write_text(jax.jit(jax.shard_map(
        lambda a: jax.lax.psum(a, "y"), mesh=mesh, in_specs=P("x", "y"), out_specs=P("x"))
    ).lower(jax.ShapeDtypeStruct((64, 64), F32)).as_text())
    out_png = tmp_path / "out.png"
    command = ["inspect", str(module), "--topology", "trn2", "--fail-link", "0,1",
               "--plot", str(out_png)]
    assert main(command) == 0
    assert f"plot written to {out_png}" in capsys.readouterr().out
    width, height = png_size(out_png)
    assert width == plot.WIDTH_INCHES * 100 and height > 600


def test_a_missing_matplotlib_is_named_with_the_extra_to_install(tmp_path, monkeypatch):
    compiled = psum_step(jax_trn2.make_mesh()).lower(*ARGS).compile()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'jax-trn2\[plot\]'"):
        compiled.plot(tmp_path / "step.png")
    assert not (tmp_path / "step.png").exists()


# --- the link loads drawn ------------------------------------------------------------------

def test_step_link_bytes_count_a_loop_body_per_trip():
    once = psum_step(jax_trn2.make_mesh()).lower(*ARGS).compile().executable.estimate
    thrice = psum_step(jax_trn2.make_mesh(), loop=3).lower(*ARGS).compile().executable.estimate
    (psum,) = [i for i in once.program.instructions if isinstance(i, isa.AllReduce)]
    single = link_bytes(psum, once.topology, once.placement)
    assert single.any() and not single[:, [0, 2], :].any()  # y links only
    np.testing.assert_allclose(plot.step_link_bytes(once), single)
    np.testing.assert_allclose(plot.step_link_bytes(thrice), 3 * single)


def test_cable_bytes_are_the_busier_direction_of_each_cable():
    topology = get_topology("trn2")  # 4x4
    loads = np.zeros((16, 2, 2))
    loads[0, 0, 1] = 5.0  # chip 0 -> its x+ neighbour, chip 4
    loads[4, 0, 0] = 7.0  # and back
    loads[12, 0, 1] = 3.0  # chip 12 (x=3) -> chip 0: the x ring's wraparound cable
    cables = plot._cable_bytes(topology, loads)
    assert cables[0, 0] == 7.0 and cables[12, 0] == 3.0
    assert len(cables) == 32 and sum(cables.values()) == 10.0  # one per cable
    ring_of_2 = topology.with_overrides(shape=(2, 8), name="2x8")
    loads = np.zeros((16, 2, 2))
    loads[0, 0, 1], loads[8, 0, 1] = 2.0, 6.0  # chips 0 and 8 share their only x cable
    cables = plot._cable_bytes(ring_of_2, loads)
    assert cables[0, 0] == 6.0 and (8, 0) not in cables
