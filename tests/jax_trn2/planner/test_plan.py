"""jax_trn2.plan: layouts, sweeps worked by hand (memory, ideal step time, tokens/s, time,
chip-hours and cost), failed and oversized layouts, worker processes, the table, the rows,
the plot and `jax-trn2 plan`."""

import functools
import json
import math
import textwrap

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from jax_trn2 import plan
from jax_trn2.cli import main
from jax_trn2.planner.layout import Layout, grid
from jax_trn2.planner.training import price_per_chip_hour, training_run
from mesh.machine import get_topology

N, M = 4096, 8192  # the update's arrays: float32, 128 MiB each
TOPOLOGY = "trn2"  # 16 chips: small meshes plan fast
CHIP = get_topology(TOPOLOGY).chip
CHIP_LINK_BANDWIDTH = get_topology(TOPOLOGY).link_bandwidth[0]  # bytes/s per direction


def update(w, g):
    return w - g


def build(layout):
    """An in-place update of w [embed, mlp] by g, split as the layout says."""
    mesh = layout.make_mesh()
    s = layout.sharding(mesh, "embed", "mlp")
    step = jax_trn2.jit(update, in_shardings=(s, s), out_shardings=s, donate_argnums=0,
                        topology=layout.topology)
    x = jax.ShapeDtypeStruct((N, M), jnp.float32)
    return step, (x, x)


FSDP16 = Layout.of(fsdp=16, topology=TOPOLOGY)
FSDP4_TP2 = Layout.of(fsdp=4, tp=2, topology=TOPOLOGY)


@pytest.fixture(scope="module")
def two_layouts():
    return plan.sweep(build, [FSDP4_TP2, FSDP16], tokens_per_step=1000, workers=1,
                      train_tokens=1e9, price_per_chip_hour=3.0, progress=False)


def test_two_layouts_worked_by_hand(two_layouts):
    """Each chip holds its piece of w and of g (the result is written into w): 2 x 128 MiB
    / chips; the ideal step reads both pieces and writes one at the HBM bandwidth."""
    first, second = two_layouts
    assert (first.layout, second.layout) == (FSDP16, FSDP4_TP2)  # ranked: the fastest first
    for p, chips in ((first, 16), (second, 8)):
        piece = N * M * 4 // chips
        assert p.estimate.devices == chips
        assert p.estimate.peak_bytes == 2 * piece
        assert p.estimate.ideal_step_seconds == pytest.approx(3 * piece / CHIP.hbm_bandwidth,
                                                              rel=1e-9)
        assert p.fits and p.headroom_bytes == CHIP.hbm_bytes - 2 * piece
        assert p.estimate.step_seconds >= p.estimate.ideal_step_seconds
        assert p.estimate.busiest_engine == "Vector" and p.estimate.mfu == 0.0
        assert p.tokens_per_second == pytest.approx(1000 / p.estimate.step_seconds)
        assert p.tokens_per_second_per_device == pytest.approx(p.tokens_per_second / chips)
    assert first.estimate.step_seconds < second.estimate.step_seconds


def test_the_sweep_reports_what_lowering_the_step_reports(two_layouts):
    step, args = build(FSDP16)
    lowered = step.lower(*args)
    info = lowered.cost_analysis()["trn2"]
    e = two_layouts[0].estimate
    assert e.step_seconds == info["step_seconds"]
    assert e.ideal_step_seconds == info["ideal_step_seconds"]
    assert e.exposed_communication_seconds == info["exposed_communication_seconds"]
    assert e.peak_bytes == lowered.memory_analysis().peak_memory_in_bytes
    assert e.donated_bytes == N * M * 4 // 16  # w's piece


def test_training_columns_worked_by_hand(two_layouts):
    p = two_layouts[0]
    run = p.training(1e9, 3.0)
    steps = 1e9 / 1000
    assert run.seconds == pytest.approx(steps * p.estimate.step_seconds)
    assert run.chip_hours == pytest.approx(16 * run.seconds / 3600)
    assert run.cost == pytest.approx(3.0 * run.chip_hours)
    row = two_layouts.rows()[0]
    assert row["rank"] == 1 and row["layout"] == "fsdp 16" and row["fsdp"] == 16
    assert row["cost"] == pytest.approx(run.cost) and row["train_days"] == run.seconds / 86400
    assert row["peak_hbm_bytes"] == 2 * N * M * 4 // 16 and row["fits"] is True


def test_the_table_says_what_each_column_is(two_layouts):
    text = str(two_layouts)
    assert "2 layouts planned" in text and "ranked: fitting first" in text
    assert "expected (with the Neuron runtime's measured costs)" in text
    assert "MFU: the devices' matmuls" in text  # no model_flops given: the estimate's MFU
    assert "cost at 3 per chip-hour" in text
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("#  layout"))
    assert lines[head + 2].split()[:4] == ["1", "fsdp", "16", "16"]
    assert "yes, 95.98 GiB free" in lines[head + 2]


def test_training_run_arithmetic():
    run = training_run(step_seconds=2.0, tokens_per_step=1000, chips=4, tokens=10_500,
                       price_per_chip_hour=3.0)
    assert run.seconds == 22.0  # 11 steps: the last, partial one counts in full
    assert run.chip_hours == 4 * 22.0 / 3600 and run.cost == 3.0 * 4 * 22.0 / 3600
    assert training_run(2.0, 1000, 4, 10_000).cost is None
    assert price_per_chip_hour(48.0, "trn2u.48xlarge") == 3.0  # 16 chips an instance
    with pytest.raises(ValueError, match="unknown instance 'p5.48xlarge'"):
        price_per_chip_hour(98.0, "p5.48xlarge")
    with pytest.raises(ValueError, match="tokens_per_step must be positive"):
        training_run(1.0, 0, 1, 10)


def test_a_layout_that_fails_and_one_that_does_not_fit():
    huge = Layout.of(fsdp=1, topology=TOPOLOGY)  # fine: 256 MiB on one chip
    odd = Layout.of(fsdp=3, topology=TOPOLOGY)  # 4096 rows do not split in 3

    def big(layout):
        step, _ = build(layout)
        x = jax.ShapeDtypeStruct((120_000, 120_000), jnp.float32)  # 53.6 GiB each
        return step, (x, x)

    sweep = plan.sweep(build, [odd, huge], workers=1, progress=False)
    assert [p.layout for p in sweep] == [huge, odd]
    assert not sweep[1].ok and "IndivisibleError" in sweep[1].error
    assert "does not evenly divide" in sweep[1].error or "evenly divide" in sweep[1].error
    # led by the layout parameter at fault, in the table too
    # the logical axis named: build asked the layout for ("embed", "mlp") alone
    assert sweep[1].error.startswith("fsdp=3 does not divide embed (4096): dimension 0 of a "
                                     "(4096, 8192) value split P('fsdp'); IndivisibleError")
    assert f"failed  fsdp 3 on {TOPOLOGY}: fsdp=3 does not divide embed" in str(sweep)
    over = plan.sweep(big, [huge], workers=1, progress=False)[0]
    assert over.ok and not over.fits and over.headroom_bytes < 0
    assert over.estimate.peak_bytes == 2 * 120_000 ** 2 * 4
    assert "NO, " in str(plan.Sweep([over]))
    assert plan.Sweep([over]).best is None


def test_warnings_are_kept_with_their_plan(recwarn):
    """A warning while planning (XLA's partitioner's, say) goes with its plan, not to the
    console once per layout; the table names the plans that have one."""
    import warnings

    def warning_build(layout):
        if layout == FSDP16:
            warnings.warn("XLA's SPMD partitioner found no efficient way to reshard")
        return build(layout)

    sweep = plan.sweep(warning_build, [FSDP4_TP2, FSDP16], workers=1, progress=False)
    assert not recwarn.list
    assert sweep[0].layout == FSDP16 and sweep[1].warnings == ()
    assert sweep[0].warnings == ("XLA's SPMD partitioner found no efficient way to reshard",)
    assert "warnings while planning #1 (XLA's partitioner, say)" in str(sweep)


def test_progress_lines(capsys):
    plan.sweep(build, [FSDP16], workers=1)
    err = capsys.readouterr().err
    assert err.startswith(f"[1/1] fsdp 16 on {TOPOLOGY}: 16.00 MiB/device, step ")
    assert "expected (planned in" in err


def test_worker_processes_give_the_same_plans(two_layouts):
    """Planned in two spawned processes: the same figures, in the same rank order."""
    sweep = plan.sweep(build, [FSDP4_TP2, FSDP16], tokens_per_step=1000, workers=2,
                       progress=False)
    assert sweep.workers == 2
    for got, want in zip(sweep, two_layouts):
        assert got.layout == want.layout and got.estimate == want.estimate


def test_a_function_other_processes_cannot_load_is_planned_here():
    sweep = plan.sweep(lambda layout: build(layout), [FSDP16, FSDP4_TP2], workers=2,
                       progress=False)
    assert sweep.workers == 1 and all(p.ok for p in sweep)


def test_bad_sweep_arguments_are_named():
    with pytest.raises(TypeError, match=r"layouts\[0\] is a dict"):
        plan.sweep(build, [{"fsdp": 16}])
    with pytest.raises(ValueError, match="price_per_chip_hour prices a training run"):
        plan.sweep(build, [FSDP16], price_per_chip_hour=3.0)
    with pytest.raises(ValueError, match="train_tokens needs tokens_per_step"):
        plan.sweep(build, [FSDP16], train_tokens=1e9)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        plan.sweep(build, [FSDP16], workers=0)


def test_a_step_made_for_another_machine_is_an_error_in_its_row():
    def elsewhere(layout):
        step, args = build(layout)
        return jax_trn2.jit(update, topology="trn2-ultra"), args

    (p,) = plan.sweep(elsewhere, [FSDP16], workers=1, progress=False)
    assert "lowered for topology 'trn2-ultra', but the layout is on 'trn2'" in p.error


def test_layout_specs_names_and_grid():
    layout = Layout.of(dp=2, fsdp=4, tp=8, remat="full")
    assert layout.name == "dp 2 x fsdp 4 x tp 8, remat full" and layout.devices == 64
    assert layout.spec("batch", None, "embed") == P(("dp", "fsdp"))  # fsdp splits batch
    assert layout.spec("embed", "mlp") == P("fsdp", "tp")
    assert Layout.of(tp=4, rules={"batch": "tp"}).spec("batch") == P("tp")
    moe = Layout.of(ep=8, cp=2, tp=4)  # experts over ep, the sequence over cp
    assert moe.spec("experts", "embed", "mlp") == P("ep", None, "tp")
    assert moe.spec("batch", "length", "embed") == P("ep", "cp")
    assert Layout.of(pp=4, fsdp=16).spec("stages", "embed") == P("pp", "fsdp")
    with pytest.raises(ValueError, match="no rule for logical axis 'tokens'"):
        layout.spec("tokens")
    too_big = Layout.of(fsdp=32, topology="trn2")  # data: made, marked by a sweep
    assert too_big.placement_error == "fsdp=32 needs 32 devices; trn2 has 16"
    with pytest.raises(ValueError, match="fsdp=32 needs 32 devices; trn2 has 16"):
        too_big.make_mesh()
    # an instance preset's devices are its logical NeuronCores: 16 chips x 4 at LNC=2
    assert Layout.of(fsdp=64, topology="trn2.48xlarge").placement_error is None
    assert Layout.of(dp=2, fsdp=64, topology="trn2.48xlarge").placement_error == \
        "dp=2 x fsdp=64 needs 128 devices; trn2.48xlarge has 64"
    with pytest.raises(ValueError, match="axis 'tp' has size 0"):
        Layout.of(tp=0)
    layouts = grid(64, ("dp", "fsdp", "tp"), remats=(None, "full"), limits={"dp": 4, "tp": 8})
    assert len(layouts) == 24
    assert all(l.devices == 64 and l.size("dp") <= 4 and l.size("tp") <= 8 for l in layouts)
    assert len({(l.axes, l.remat) for l in layouts}) == 24
    assert Layout.of(pp=4, microbatches=8, schedule="1f1b").name == \
        "pp 4, 1f1b, 8 microbatches"


def test_sweep_plot_writes_an_image(two_layouts, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "sweep.svg"
    two_layouts.plot(path)
    svg = path.read_text()
    assert "<svg" in svg and "fsdp 4 x tp 2" in svg and "HBM per device" in svg


def test_jax_trn2_plan_command(tmp_path, capsys):
    script = tmp_path / "step_script.py"
    script.write_text(textwrap.dedent('''
        import jax, jax.numpy as jnp
        import jax_trn2

        def build(layout):
            mesh = layout.make_mesh()
            s = layout.sharding(mesh, "embed", "mlp")
            step = jax_trn2.jit(lambda w, g: w - g, in_shardings=(s, s), out_shardings=s,
                                topology=layout.topology)
            x = jax.ShapeDtypeStruct((1024, 2048), jnp.float32)
            return step, (x, x)
    '''))
    rows = tmp_path / "rows.json"
    assert main(["plan", f"{script}:build", "--grid", "16", "--axes", "fsdp,tp", "--max",
                 "tp=2", "--topology", TOPOLOGY, "--tokens-per-step", "100",
                 "--json", str(rows), "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "2 layouts planned" in out and "tokens/s" in out
    assert {r["layout"] for r in json.loads(rows.read_text())} == {"fsdp 16", "fsdp 8 x tp 2"}
    assert main(["plan", f"{script}:build"]) == 1
    assert "give layouts to plan" in capsys.readouterr().err


def test_plan_command_passes_each_param_to_build(tmp_path, capsys):
    script = tmp_path / "param_script.py"
    script.write_text(textwrap.dedent('''
        import jax, jax.numpy as jnp
        import jax_trn2

        def build(layout, rows=1024, dtype="float32"):
            mesh = layout.make_mesh()
            s = layout.sharding(mesh, "embed", "mlp")
            step = jax_trn2.jit(lambda w, g: w - g, in_shardings=(s, s), out_shardings=s,
                                topology=layout.topology)
            x = jax.ShapeDtypeStruct((rows, 2048), dtype)
            return step, (x, x)
    '''))
    rows = tmp_path / "rows.json"
    for command in ([], ["--search"]):
        assert main(["plan", f"{script}:build", "--layout", "fsdp=16", "--topology", TOPOLOGY,
                     "--param", "rows=2048", "--param", "rows=4096", "--param",
                     "dtype=bfloat16", "--json", str(rows), "--workers", "1", *command]) == 0
        planned = json.loads(rows.read_text())
        assert {(r["rows"], r["dtype"]) for r in planned} == {(2048, "bfloat16"),
                                                              (4096, "bfloat16")}
        # w, g and w - g, each rows x 2048 bfloat16 split over 16 chips: built as given
        for r in planned:
            assert r["peak_hbm_bytes"] == 3 * r["rows"] * 2048 * 2 // 16
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["plan", f"{script}:build", "--layout", "fsdp=16", "--param", "rows"])
    assert "expected NAME=VALUE" in capsys.readouterr().err


def test_bubble_is_left_out_of_layouts_without_a_pipeline(two_layouts):
    p = plan.Plan(FSDP16, two_layouts[0].estimate, model_flops=1e9)
    assert p.bubble is None and p.gpipe_bubble is None
    assert p.model_mfu() == pytest.approx(
        1e9 / (16 * CHIP.peak_flops_for("bfloat16") * p.estimate.step_seconds))
    assert math.isfinite(p.model_mfu(ideal=True))


def test_a_grid_over_two_machines_marks_what_the_smaller_cannot_hold():
    """32 devices over fsdp x tp (tp <= 2) on trn2 (16 chips) and trn2-ultra (64): the two
    layouts are planned on trn2-ultra and marked on trn2, each with the axes at fault."""
    layouts = grid(32, ("fsdp", "tp"), limits={"tp": 2}, topologies=("trn2", "trn2-ultra"))
    assert len(layouts) == 4
    sweep = plan.sweep(build, layouts, workers=1, progress=False)
    planned = {p.layout.name for p in sweep if p.ok}
    marked = {p.layout.name: p.error for p in sweep if not p.ok}
    assert {p.layout.topology_name for p in sweep if p.ok} == {"trn2-ultra"}
    assert planned == {"fsdp 32", "fsdp 16 x tp 2"}
    assert marked == {"fsdp 32": "fsdp=32 needs 32 devices; trn2 has 16",
                      "fsdp 16 x tp 2": "fsdp=16 x tp=2 needs 32 devices; trn2 has 16"}
    for p in sweep:
        if p.ok:  # each chip holds 1/32 of w and of g
            assert p.estimate.peak_bytes == 2 * N * M * 4 // 32
    text = str(sweep)
    assert "not placed  fsdp 32 on trn2: fsdp=32 needs 32 devices; trn2 has 16" in text
    assert sorted(r["error"] for r in sweep.rows()[2:]) == sorted(marked.values())


def test_an_error_no_layout_can_avoid_is_raised_once():
    """A logical axis no layout's rules map fails every layout alike: the sweep raises it
    once instead of printing it per layout; a layout with a rule for it is planned."""
    calls = []

    def tokens_build(layout):
        calls.append(layout)
        mesh = layout.make_mesh()
        s = layout.sharding(mesh, "tokens", "mlp")
        step = jax_trn2.jit(update, in_shardings=(s, s), out_shardings=s,
                            topology=layout.topology)
        x = jax.ShapeDtypeStruct((N, M), jnp.float32)
        return step, (x, x)

    with pytest.raises(plan.UnknownLogicalAxisError, match="no rule maps logical axis "
                       "'tokens' in any of the 2 layouts") as raised:
        plan.sweep(tokens_build, [FSDP16, FSDP4_TP2], workers=1, progress=False)
    assert raised.value.axis == "tokens" and len(calls) == 1  # stopped at the first
    with_rule = Layout.of(fsdp=16, topology=TOPOLOGY, rules={"tokens": "fsdp"})
    sweep = plan.sweep(tokens_build, [FSDP4_TP2, with_rule], workers=1, progress=False)
    assert sweep[0].layout == with_rule and sweep[0].ok
    assert "no rule for logical axis 'tokens'" in sweep[1].error


def test_a_flax_model_with_maxtext_logical_axis_names_plans_in_every_layout():
    """A Flax attention + MLP block whose parameters carry MaxText's logical names
    (embed, q_heads, kv_heads, kv, mlp, vocab, norm) is split by the default rules as
    MaxText splits it (`kv`, a head's own dim, never) and plans in every layout."""
    nn = pytest.importorskip("flax.linen")
    d, heads, head_dim, ff, vocab = 256, 8, 32, 512, 1024

    class Block(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            def param(name, shape, names):
                return self.param(name, nn.with_logical_partitioning(
                    nn.initializers.normal(0.02), names), shape)
            x = param("embedding", (vocab, d), ("vocab", "embed"))[tokens]
            x = x * param("scale", (d,), ("norm",))
            q = jnp.einsum("bld,dhk->blhk", x, param("q", (d, heads, head_dim),
                                                     ("embed", "q_heads", "kv")))
            k = jnp.einsum("bld,dhk->blhk", x, param("k", (d, heads, head_dim),
                                                     ("embed", "kv_heads", "kv")))
            x = x + jnp.einsum("blhk,hkd->bld", q * k, param("o", (heads, head_dim, d),
                                                            ("heads", "kv", "embed")))
            h = jax.nn.gelu(x @ param("wi", (d, ff), ("embed", "mlp")))
            x = x + h @ param("wo", (ff, d), ("mlp", "embed"))
            return x @ param("head", (d, vocab), ("embed", "vocab"))

    model = Block()
    tokens = jax.ShapeDtypeStruct((16, 64), jnp.int32)
    boxed = jax.eval_shape(model.init, jax.random.key(0), tokens)
    logical = nn.get_partition_spec(boxed)["params"]
    params = nn.unbox(boxed)["params"]

    def train_step(params, tokens):
        def loss(p):
            logits = model.apply({"params": p}, tokens)
            return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])
        grads = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    def flax_build(layout):
        mesh = layout.make_mesh()
        weights = jax.tree.map(lambda spec: layout.sharding(mesh, *spec), logical,
                               is_leaf=lambda x: isinstance(x, P))
        step = jax_trn2.jit(train_step, in_shardings=(weights, layout.sharding(mesh, "batch")),
                            out_shardings=weights, donate_argnums=0, topology=layout.topology)
        return step, (params, tokens)

    layout = Layout.of(fsdp=4, tp=4)
    assert layout.spec("embed", "q_heads", "kv") == P("fsdp", "tp")
    assert layout.spec("heads", "kv", "embed") == P("tp", None, "fsdp")
    assert layout.spec("norm") == P("tp") and layout.spec("vocab", "embed") == P("tp", "fsdp")
    layouts = grid(16, ("fsdp", "tp"), limits={"tp": 4}, topologies=(TOPOLOGY,))
    sweep = plan.sweep(flax_build, layouts, workers=1, progress=False)
    assert len(sweep) == 3 and all(p.ok for p in sweep), [p.error for p in sweep]


def gather_and_scatter(layout):
    """A step with one known all-gather (w: bf16[2048,2048], 8 MiB whole) and one known
    reduce-scatter (y: bf16[1024,2048], 4 MiB) over fsdp 16."""
    mesh = layout.make_mesh()

    def body(w, x):
        y = x @ jax.lax.all_gather(w, "fsdp", tiled=True)
        return jax.lax.psum_scatter(y, "fsdp", scatter_dimension=1, tiled=True)

    step = jax_trn2.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("fsdp"), P()),
                                      out_specs=P(None, "fsdp")), topology=layout.topology)
    return step, (jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16),
                  jax.ShapeDtypeStruct((1024, 2048), jnp.bfloat16))


def test_communication_by_collective_kind_and_the_busiest_links():
    """Each kind's time is its collective's planned time; the kinds add up to the step's
    communication and exposed communication; on trn2's 4x4 torus the rotated rings carry
    (n-1)/n of each message over 4 link directions, so the busiest link carries
    (8 MiB + 4 MiB) x 15/16 / 4."""
    step, args = gather_and_scatter(FSDP16)
    lowered = step.lower(*args)
    info = lowered.cost_analysis()["trn2"]
    plans = {type(i).__name__: i.plan for i in lowered.program.instructions
             if getattr(i, "plan", None) is not None}
    kinds = info["communication_by_kind"]
    assert set(kinds) == {"all-gather", "reduce-scatter"}
    for kind, name in (("all-gather", "AllGather"), ("reduce-scatter", "ReduceScatter")):
        assert kinds[kind]["count"] == 1
        assert kinds[kind]["seconds"] == pytest.approx(plans[name].expected_seconds, rel=1e-12)
        assert 0 < kinds[kind]["exposed_seconds"] <= kinds[kind]["seconds"]
    assert sum(t["seconds"] for t in kinds.values()) == pytest.approx(
        info["communication_seconds"], rel=1e-12)
    assert sum(t["exposed_seconds"] for t in kinds.values()) == pytest.approx(
        info["exposed_communication_seconds"], rel=1e-12)
    busiest = (8 + 4) * 2**20 * 15 / 16 / 4
    link = info["busiest_links"][0]
    assert link["bytes"] == busiest
    assert link["seconds"] == pytest.approx(busiest / CHIP_LINK_BANDWIDTH, rel=1e-12)
    (p,) = plan.sweep(gather_and_scatter, [FSDP16], workers=1, progress=False)
    row = p.row()
    assert row["all-gather_count"] == 1 and row["reduce-scatter_count"] == 1
    assert row["all-gather_seconds"] == kinds["all-gather"]["seconds"]
    assert row["reduce-scatter_exposed_seconds"] == kinds["reduce-scatter"]["exposed_seconds"]
    assert row["busiest_links"][0]["bytes"] == busiest
    assert "AG 1x" in str(plan.Sweep([p])) and "RS 1x" in str(plan.Sweep([p]))


def test_the_sweep_splits_each_plans_peak():
    """The in-place update w - g: at the peak each chip holds its pieces of w (donated)
    and g (128 MiB / 16 each), nothing else."""
    (p,) = plan.sweep(build, [FSDP16], workers=1, progress=False)
    piece = N * M * 4 // 16
    split = p.estimate.peak_split
    assert (split.donated_arguments, split.other_arguments, split.outputs,
            split.temporaries) == (piece, piece, 0, 0)
    row = p.row()
    assert (row["peak_donated_argument_bytes"], row["peak_other_argument_bytes"],
            row["peak_output_bytes"], row["peak_temporary_bytes"]) == (piece, piece, 0, 0)


def test_sweep_plot_labels_do_not_overlap(two_layouts):
    """Eight layouts within 1% of each other and one apart: every rank is labelled, no two
    labels overlap (close points share one), and the key beside the plot names each."""
    pytest.importorskip("matplotlib")
    import dataclasses
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from jax_trn2.core.plot import sweep_figure

    base = two_layouts[0].estimate
    layouts = [Layout.of(fsdp=16 // d, tp=d, topology=TOPOLOGY) for d in (1, 2, 4, 8, 16)] + \
        [Layout.of(dp=d, fsdp=16 // d, topology=TOPOLOGY) for d in (2, 4, 8, 16)]
    plans = [plan.Plan(layout, dataclasses.replace(
        base, peak_bytes=int(base.peak_bytes * (1 + k / 1000 if k < 8 else 3)),
        step_seconds=base.step_seconds * (1 + k / 1000 if k < 8 else 2)))
        for k, layout in enumerate(layouts)]
    figure = sweep_figure(plan.Sweep(plans))
    axes, key = figure.axes
    renderer = FigureCanvasAgg(figure).get_renderer()
    labels = [t for t in axes.texts if not t.get_text().startswith("HBM per device")]
    ranks = sorted(int(r) for t in labels for r in t.get_text().split(", "))
    assert ranks == list(range(1, 10))
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert len(labels) >= 2  # the far point keeps its own
    listed = key.texts[0].get_text()
    assert all(p.layout.name in listed for p in plans)


def test_a_duration_column_has_one_unit():
    from jax_trn2.planner.tables import column_durations
    assert column_durations([5921.23, 2.7 * 3600]) == ["1.6 h", "2.7 h"]  # not '5,921.23 s'
    # the longest sets the unit; a short one keeps two significant digits
    assert column_durations([0.0, 0.0123, 2.5]) == ["0.000 s", "0.012 s", "2.500 s"]
    assert column_durations([3 * 86400, 86400 / 2]) == ["3.00 days", "0.50 days"]
    assert column_durations([]) == []


def test_the_sweep_table_shows_each_duration_column_in_one_unit(two_layouts):
    lines = str(two_layouts).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("#  layout"))
    rows = lines[head + 2:head + 4]
    starts = [lines[head].index(h) for h in ("step (expected)", "time to train")]
    for start in starts:  # the unit after each row's number in the column
        units = {row[start:].split()[1] for row in rows}
        assert len(units) == 1, rows


# Layouts over the devices users rent: a trn2.48xlarge is 16 chips x 4 logical NeuronCores
# (LNC=2) of 24 GiB each.
INSTANCE = "trn2.48xlarge"
GIB = 2**30


def test_a_trn2_48xlarge_grid_counts_its_64_devices_and_puts_tp_on_a_chip():
    from mesh.machine import place_mesh
    layouts = grid(64, ("fsdp", "tp"), topologies=(INSTANCE,), limits={"tp": 4})
    assert sorted(l.name for l in layouts) == ["fsdp 16 x tp 4", "fsdp 32 x tp 2", "fsdp 64"]
    assert all(l.devices == 64 and l.chips == 16 and l.placement_error is None
               for l in layouts)
    assert Layout.of(tp=2, topology=INSTANCE).chips == 1  # two cores of one chip
    # the mesh's axes go outermost first (MESH_ORDER), whatever order they were given in
    layout = Layout.of(tp=4, fsdp=16, topology=INSTANCE)
    assert layout == Layout.of(fsdp=16, tp=4, topology=INSTANCE)
    assert Layout.of(tp=2, pp=2, cp=2, ep=2, fsdp=2, dp=2).name == \
        "dp 2 x pp 2 x fsdp 2 x ep 2 x cp 2 x tp 2"
    assert Layout.of(tensor=4, data=2).name == "tensor 4 x data 2"  # not the planner's names
    mesh = layout.make_mesh()
    assert mesh.axis_names == ("fsdp", "tp") and mesh.devices.shape == (16, 4)
    chips = place_mesh(layout.machine, (16, 4), ("fsdp", "tp")).device_to_chip
    groups = [chips[4 * f:4 * f + 4] for f in range(16)]  # the tp group of each fsdp index
    assert all(len(set(g)) == 1 for g in groups)  # each on one chip
    assert sorted(g[0] for g in groups) == list(range(16))  # fsdp over the 16 chips


def big_update(rows, layout):
    """build() with w and g of [rows, 2**16] float32: each device holds its two pieces."""
    mesh = layout.make_mesh()
    s = layout.sharding(mesh, "embed", "mlp")
    step = jax_trn2.jit(update, in_shardings=(s, s), out_shardings=s, donate_argnums=0,
                        topology=layout.topology)
    x = jax.ShapeDtypeStruct((rows, 2**16), jnp.float32)
    return step, (x, x)


@pytest.mark.parametrize("gib", [22, 26])
def test_the_fit_limit_on_a_trn2_48xlarge_is_24_gib_per_device(gib):
    """fsdp 16 x tp 4: each device holds a (rows / 16, 2**16 / 4) piece of w and one of g,
    gib / 2 GiB each: 22 GiB fits a device's 24 GiB, 26 does not (a chip would hold 4 x)."""
    rows = gib // 2 * 2**18  # a piece is rows / 16 x 2**14 float32 = gib / 2 GiB
    layout = Layout.of(fsdp=16, tp=4, topology=INSTANCE)
    (p,) = plan.sweep(functools.partial(big_update, rows), [layout], workers=1,
                      tokens_per_step=1000, train_tokens=1e6, progress=False)
    assert p.estimate.devices == 64 and p.estimate.hbm_bytes == 24 * GIB
    assert p.estimate.peak_bytes == gib * GIB and p.fits == (gib < 24)
    assert p.tokens_per_second_per_device == pytest.approx(p.tokens_per_second / 64)
    assert p.training(1e6).chip_hours == pytest.approx(16 * p.training(1e6).seconds / 3600)
    row = p.row()
    assert (row["devices"], row["chips"]) == (64, 16)
    text = str(plan.Sweep([p]))
    assert "a device: an LNC=2 logical core of a chip on trn2.48xlarge (4 per chip, " \
        "24.00 GiB)" in text
    assert "devices  peak HBM/device" in text
    if gib < 24:
        assert "recommended: fsdp 16 x tp 4 on trn2.48xlarge" in text
    else:
        assert "recommended: none: no planned layout fits in a device's HBM" in text
        assert "fsdp 16 x tp 4: does not fit: peak 26.00 GiB > 24.00 GiB per device" in text


def made_plan(step_ms, peak_gib=20.0, all_reduce_ms=0.0, mfu=0.5, remat=None,
              model_flops=None, **axes):
    """A plan on a trn2.48xlarge with these figures (64 devices of 1 TFLOP/s): the
    recommendation reads nothing else."""
    from mesh.memory import PeakSplit
    from mesh.perf.estimate import CollectiveTimes
    step = step_ms * 1e-3
    communication = (CollectiveTimes("all-reduce", 2, 2 * all_reduce_ms * 1e-3,
                                     all_reduce_ms * 1e-3),) if all_reduce_ms else ()
    e = plan.StepEstimate(
        devices=64, topology=INSTANCE, peak_bytes=int(peak_gib * GIB), hbm_bytes=24 * GIB,
        step_seconds=step, ideal_step_seconds=step / 2, mfu=mfu, hfu=mfu, ideal_mfu=mfu,
        exposed_communication_seconds=all_reduce_ms * 1e-3, busiest_engine="Tensor",
        busiest_seconds=step / 2, peak_flops=1e12, donated_bytes=0,
        peak_split=PeakSplit(donated_arguments=int(4 * GIB), other_arguments=int(2 * GIB),
                             temporaries=int((peak_gib - 6) * GIB)),
        communication=communication)
    layout = Layout.of(remat=remat, topology=INSTANCE, **axes)
    return plan.Plan(layout, e, model_flops=model_flops)


def test_the_recommendation_is_the_fastest_fitting_layout_and_says_why_the_next_lost():
    best = made_plan(10.0, fsdp=16, tp=4)
    too_big = made_plan(8.0, peak_gib=26.0, fsdp=64)  # faster, 26 GiB > 24 GiB
    too_big_too = made_plan(9.0, peak_gib=25.0, dp=2, fsdp=32)
    # model FLOPs at 40% of 64 devices' peak over the step, against an MFU of 50%: a
    # bubble of 1 - 0.4 / 0.5 = 20% of the 12.5 ms, 2.5 ms
    piped = made_plan(12.5, model_flops=0.4 * 64 * 1e12 * 12.5e-3, pp=4, fsdp=4, tp=4)
    reduced = made_plan(13.1, all_reduce_ms=3.1, dp=4, fsdp=4, tp=4)  # 3.1 ms of AR exposed
    remat = made_plan(14.0, remat="full", fsdp=16, tp=4)  # 4 ms more of compute
    slow_and_big = made_plan(30.0, peak_gib=30.0, dp=2, fsdp=32)  # neither: not a runner-up
    failed = plan.Plan(Layout.of(tp=64, topology=INSTANCE), None, "ValueError: tp=64 ...")
    sweep = plan.Sweep([remat, failed, too_big_too, reduced, piped, slow_and_big, too_big,
                        best])
    rec = sweep.recommendation
    assert rec.best is best is sweep.best
    assert [(r.plan, r.reason) for r in rec.runners_up] == [
        (too_big, "does not fit: peak 26.00 GiB > 24.00 GiB per device (temporaries "
                  "20.00 GiB of it)"),
        (too_big_too, "does not fit: peak 25.00 GiB > 24.00 GiB per device (temporaries "
                      "19.00 GiB of it)"),
        (piped, "2.5 ms slower (1.25x the step): pipeline bubble 20% (2.5 ms more)"),
        (reduced, "3.1 ms slower (1.31x the step): exposed all-reduce 3.1 ms more"),
        (remat, "4.0 ms slower (1.40x the step): compute 4.0 ms more (busiest engine Tensor; "
                "remat full recomputes)")]
    assert str(rec).splitlines()[:2] == [
        "recommended: fsdp 16 x tp 4 on trn2.48xlarge: step 10.0 ms expected, peak "
        "20.00 GiB of 24.00 GiB per device", "why not the next ones:"]
    text = str(sweep)
    assert text.index(str(rec)) > text.index("#  layout")  # printed under the table
    assert [r.plan for r in plan.recommend(sweep.plans, count=1).runners_up] == \
        [too_big, piped]  # the fastest that does not fit, the next that does
    nothing = plan.Sweep([too_big, slow_and_big]).recommendation
    assert nothing.best is None and [r.plan for r in nothing.runners_up] == \
        [too_big, slow_and_big]  # nearest to fitting first
