"""Inspecting programs: listings, cost_analysis, traces and the jax-trn2 inspect command."""

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from jax_trn2.cli import main
from mesh import isa
from mesh.perf.schedule import ENGINES
from mesh.perf.trace import chrome_trace

REPO = Path(__file__).resolve().parents[3]
M, K, N = 64, 256, 128  # global a[M, K] @ b[K, N]; K split over y, M over x
TIMED_LINE = re.compile(r"^\s+\d[\d,]*\.\d{3} \+\s*\d[\d,]*\.\d{3}[* ]  %")


def step_body(a, b):
    return jax.lax.psum(jnp.dot(a, b, preferred_element_type=jnp.float32), "y")


def shard_step(mesh):
    return jax.shard_map(step_body, mesh=mesh, in_specs=(P("x", "y"), P("y", None)),
                         out_specs=P("x", None))


ARGS = (jax.ShapeDtypeStruct((M, K), jnp.bfloat16), jax.ShapeDtypeStruct((K, N), jnp.bfloat16))


@pytest.fixture(scope="module")
def lowered():
    return jax_trn2.jit(shard_step(jax_trn2.make_mesh())).lower(*ARGS)


@pytest.fixture(scope="module")
def compiled(lowered):
    return lowered.compile()


@pytest.fixture(scope="module")
def stablehlo_file(tmp_path_factory):
    """What a user would write: jax.jit(f).lower(...).as_text() of the same program."""
    mesh = jax.sharding.AbstractMesh((4, 4, 4), ("x", "y", "z"),
                                     axis_types=(jax.sharding.AxisType.Auto,) * 3)
    path = tmp_path_factory.mktemp("inspect") / "step.mlir"
    path.write_text(jax.jit(shard_step(mesh)).lower(*ARGS).as_text())
    return path


def test_cost_analysis_totals_are_sums_over_instructions(compiled):
    cost = compiled.cost_analysis()
    estimate = compiled.executable.estimate
    for key in ("flops", "bytes accessed", "transcendentals", "optimal_seconds"):
        # float sums of the same terms in another order
        assert sum(c.jax_dict()[key] for c in estimate.costs) == pytest.approx(cost[key],
                                                                               rel=1e-12)
    # per chip: a[16, 64] @ b[64, 128], as jax counts a partitioned program
    assert cost["flops"] == 2 * (M // 4) * (K // 4) * N
    assert cost["optimal_seconds"] == cost["trn2"]["step_seconds"] > 0
    trn2 = cost["trn2"]
    assert set(trn2["engine_busy_seconds"]) == set(ENGINES)
    assert 0 < trn2["mfu"] < 1
    assert 0 <= trn2["exposed_communication_seconds"] <= trn2["communication_seconds"]


def test_planned_program_is_the_one_that_runs(compiled):
    program = compiled.executable.program
    matmuls = [i for i in program.instructions if isinstance(i, isa.Matmul)]
    collectives = [i for i in program.instructions if isinstance(i, isa.AllReduce)]
    assert matmuls and collectives
    assert all(m.tiling is not None and m.pass_size == m.tiling.k_pass for m in matmuls)
    assert all(c.plan is not None and c.plan.torus_axes == ("y",) for c in collectives)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(jnp.bfloat16)
    b = rng.standard_normal((K, N)).astype(jnp.bfloat16)
    want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
    # FP32 sums of 256 BF16 products in different orders: 2**-14 of the largest magnitude
    np.testing.assert_allclose(compiled(a, b), want, atol=2.0**-14 * np.abs(want).max())


def test_lowered_listing_shows_tiles_and_torus_plans(lowered):
    text = lowered.as_text()
    assert "target: trn2-ultra torus 4x4x4" in text
    assert "tensor engine: B=1 M=16 N=128 K=64 per chip" in text
    # psum of the FP32 partial product [16, 128]: 8 KiB per chip
    assert re.search(r"torus: all-reduce of 8\.00 KiB over logical y -> torus y", text)
    assert "stablehlo.dot_general" in lowered.as_text(dialect="stablehlo")


def test_compiled_listing_has_a_time_on_every_instruction(compiled):
    text = compiled.as_text()
    timed = [line for line in text.splitlines() if TIMED_LINE.match(line)]
    assert len(timed) == len(compiled.executable.program.instructions)
    assert "estimated step time" in text and "MFU" in text


def test_trace_has_a_process_per_chip_and_a_thread_per_engine(compiled, tmp_path):
    path = tmp_path / "step.json"
    compiled.save_trace(path, chips=[0, 21])
    events = json.loads(path.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes) == [0, 21] and "(1, 1, 1)" in processes[21]
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert set(ENGINES) <= threads
    program = compiled.executable.program
    per_chip = [e for e in events if e["ph"] == "X" and e["pid"] == 21
                and not e["name"].startswith("hbm ")]
    assert sorted(e["name"] for e in per_chip) == sorted(i.mnemonic for i in program.instructions)
    dot = next(e for e in per_chip if e["name"] == "Matmul")
    assert dot["args"]["outputs"][0].endswith("float32[16,128]{x,y}")
    assert dot["args"]["bytes"] > 0 and dot["dur"] > 0 and "tiling" in dot["args"]


def test_trace_of_all_chips_and_unknown_chips(compiled, tmp_path):
    trace = chrome_trace(compiled.executable.estimate)
    assert len({e["pid"] for e in trace["traceEvents"]}) == 64
    with pytest.raises(ValueError, match=r"chips \[64\] are not chips the program runs on"):
        compiled.save_trace(tmp_path / "bad.json", chips=[64])


def test_cli_inspects_a_stablehlo_file(stablehlo_file, tmp_path, capsys):
    trace = tmp_path / "out.json"
    assert main(["inspect", str(stablehlo_file), "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "tensor engine:" in out and "torus: all-reduce" in out
    assert "estimated step time" in out and f"trace written to {trace}" in out
    assert "HBM per chip: peak" in out and "live at the peak" in out
    assert len({e["pid"] for e in json.loads(trace.read_text())["traceEvents"]}) == 64


def test_cli_reads_bytecode(stablehlo_file, tmp_path, capsys):
    from lowering.mlir import parse_module
    path = tmp_path / "step.mlirbc"
    with open(path, "wb") as f:
        parse_module(stablehlo_file.read_text()).operation.write_bytecode(f)
    assert main(["inspect", str(path)]) == 0
    assert "estimated step time" in capsys.readouterr().out


def test_cli_errors_name_the_problem(stablehlo_file, tmp_path, capsys):
    assert main(["inspect", str(stablehlo_file), "--topology", "trn2"]) == 1
    assert "topology 'trn2' has only 16 chips" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing.mlir")]) == 1
    assert "No such file" in capsys.readouterr().err


def test_python_dash_m(stablehlo_file):
    result = subprocess.run([sys.executable, "-m", "jax_trn2", "inspect", str(stablehlo_file),
                             "--topology", "trn2-ultra"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "estimated step time" in result.stdout


def test_loop_body_cost_is_multiplied_by_its_trip_count():
    def f(x, w):
        return jax.lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c @ w), x)

    args = (jax.ShapeDtypeStruct((128, 256), jnp.float32),
            jax.ShapeDtypeStruct((256, 256), jnp.float32))
    cost = jax_trn2.jit(f).lower(*args).compile().cost_analysis()
    assert cost["transcendentals"] == 4 * 128 * 256
    dots = 4 * 2 * 128 * 256 * 256
    assert dots <= cost["flops"] < dots + 100  # plus the loop counter's adds and compares
    assert cost["trn2"]["loops_of_unknown_trip_count"] == 0


def test_cli_with_a_failed_link_lists_the_faults_and_the_slowdown(stablehlo_file, capsys):
    # chips 0 and 4 are neighbours along y, the axis the psum runs on
    assert main(["inspect", str(stablehlo_file), "--fail-link", "0,4"]) == 0
    out = capsys.readouterr().out
    assert "faults: failed links 0->4, 4->0" in out
    assert re.search(r"faults: .*x the healthy", out)


def test_cli_with_a_failed_chip_under_the_mesh_names_it(stablehlo_file, capsys):
    assert main(["inspect", str(stablehlo_file), "--fail-chip", "5"]) == 1
    assert "chip 5 at torus (0, 1, 1) held device 5 (x=0, y=1, z=1)" in capsys.readouterr().err


@pytest.fixture(scope="module")
def small_mesh_file(tmp_path_factory):
    """A shard_map program on a (2, 4) mesh: 8 of trn2-ultra's 64 chips."""
    mesh = jax.sharding.AbstractMesh((2, 4), ("a", "b"),
                                     axis_types=(jax.sharding.AxisType.Auto,) * 2)
    f = jax.shard_map(lambda x: jax.lax.psum(x, "b"), mesh=mesh, in_specs=P("a", "b"),
                      out_specs=P("a"))
    path = tmp_path_factory.mktemp("inspect") / "small.mlir"
    path.write_text(jax.jit(f).lower(jax.ShapeDtypeStruct((4, 8), jnp.float32)).as_text())
    return path


def test_cli_offers_an_origin_off_a_failed_chip_that_it_accepts(small_mesh_file, capsys):
    # b on the x ring, a on a segment of y: chips 0, 4, 16, 20, ... (chip = 16 x + 4 y + z)
    command = ["inspect", str(small_mesh_file), "--topology", "trn2-ultra", "--fail-chip", "4"]
    assert main(command) == 1
    offered = re.search(r"--origin (\d+,\d+,\d+)`", capsys.readouterr().err)
    assert offered is not None and offered.group(1) == "0,0,1"
    assert main(command + ["--origin", offered.group(1)]) == 0
    assert "chips 1, 5, 17, 21, 33, 37, 49, 53 (8 of 64)" in capsys.readouterr().out


def test_cli_runs_a_module_on_make_meshs_default_topology(small_mesh_file, capsys):
    """An 8-device module and a (2, 4) make_mesh both meet trn2-ultra by default: the
    docs/cost_model.md's `--fail-link 0,16` (trn2-ultra's chips) works on it without --topology."""
    assert main(["inspect", str(small_mesh_file), "--fail-link", "0,16"]) == 0
    out = capsys.readouterr().out
    assert "target: trn2-ultra torus 4x4x4" in out and "faults: failed links 0->16" in out
    mesh = jax_trn2.make_mesh((2, 4), ("a", "b"))
    assert len(mesh.devices.flat) == 8 and mesh.devices.flat[7].id == 7
    from jax_trn2.core.machines import topology_for
    assert topology_for((2, 4), ("p", "q"), None).name == "trn2-ultra"


def test_cli_fault_on_the_default_topology_says_it_was_chosen(small_mesh_file, capsys):
    """A chip beyond the default topology's: the error says which was chosen and how to
    pick another."""
    assert main(["inspect", str(small_mesh_file), "--fail-chip", "200"]) == 1
    err = capsys.readouterr().err
    assert "(no --topology given: trn2-ultra is the default for the module's 8-device mesh; " \
           "choose another with --topology NAME)" in err
    command = ["inspect", str(small_mesh_file), "--fail-chip", "200", "--topology"]
    assert main(command + ["trn2-ultra"]) == 1
    assert "--topology" not in capsys.readouterr().err  # the user chose trn2-ultra
    assert main(command + ["trn2-ultra-max"]) == 0


def test_cli_origin_for_a_module_without_a_mesh_is_an_error(tmp_path, capsys):
    path = tmp_path / "plain.mlir"
    path.write_text(jax.jit(jnp.sin).lower(jax.ShapeDtypeStruct((4,), jnp.float32)).as_text())
    assert main(["inspect", str(path), "--origin", "0,1,0"]) == 1
    assert "origin (0, 1, 0) places a mesh, but the program has none" in \
        capsys.readouterr().err


def test_cli_locates_ops_of_a_module_without_debug_locations_in_the_file(stablehlo_file,
                                                                          capsys):
    # jax's as_text() has no debug locations: an op's place is its line of the .mlir file.
    assert main(["inspect", str(stablehlo_file)]) == 0
    out = capsys.readouterr().out
    line = re.search(rf"Collective\.AllReduce.*# {re.escape(stablehlo_file.name)}:(\d+)$", out,
                     re.M)
    assert line is not None
    assert "all_reduce" in stablehlo_file.read_text().splitlines()[int(line.group(1)) - 1]
    assert re.search(r" from step\.mlir:\d+$", out, re.M)
    assert "-:" not in out


def test_module_text_without_a_file_names_its_lines_as_the_modules():
    text = jax.jit(jnp.sin).lower(jax.ShapeDtypeStruct((4,), jnp.float32)).as_text()
    executable = jax_trn2.client().compile(text)
    assert re.search(r"Scalar\.sin.*# <module>:\d+$", executable.as_text(), re.M)
