"""jax_trn2.plan.search and sweeps over the build's parameters: each variant's own tokens
and FLOPs, and pruning bounds that are lower bounds of the full plans."""

import functools

import jax
import jax.numpy as jnp
import pytest

import jax_trn2
import lowering
from jax_trn2 import plan
from jax_trn2.planner.layout import Layout, grid
from jax_trn2.planner.resident import least_resident_bytes
from jax_trn2.planner.search import (MEMORY, SHAPE, TIME, Matmul, argument_bytes,
                                     compute_seconds, matmul_flops, matmul_work, memory_floor,
                                     memory_lower_bound)
from mesh.machine import get_topology

TOPOLOGY = "trn2"  # 16 chips of 96 GiB
HBM = get_topology(TOPOLOGY).device.hbm_bytes
D = 65536  # w and its two moments: f32[D, 2 D], 32 GiB each (96 GiB: one chip's HBM)
W, B = 2 * D, 4096  # the layer's width; the batch


def adam_like(w, m, v, x):
    """A step of a linear layer trained with two moments, as Adam keeps them."""
    def loss(w):
        return jnp.tanh(x @ w.astype(jnp.bfloat16)).astype(jnp.float32).sum()
    g = jax.grad(loss)(w)
    m = 0.9 * m + 0.1 * g
    v = 0.99 * v + 0.01 * g * g
    return w - 1e-3 * m / (jnp.sqrt(v) + 1e-8), m, v


def build(layout, batch=B, width=W):
    mesh = layout.make_mesh()
    ws = layout.sharding(mesh, "embed", "mlp")
    xs = layout.sharding(mesh, "batch", "embed")
    step = jax_trn2.jit(adam_like, in_shardings=(ws, ws, ws, xs), out_shardings=(ws,) * 3,
                        donate_argnums=(0, 1, 2), topology=layout.topology)
    w = jax.ShapeDtypeStruct((D, width), jnp.float32)
    return step, (w, w, w, jax.ShapeDtypeStruct((batch, D), jnp.bfloat16))


def step_flops(batch, width=W):
    """x @ w forward, and x^T @ dy for w's gradient: 2 matmuls of 2 * batch * D * width."""
    return 2 * 2.0 * batch * D * width


def test_a_sweep_over_the_build_parameters_gives_each_variant_its_own_figures():
    layout = Layout.of(fsdp=16, topology=TOPOLOGY)
    swept = plan.sweep(build, [layout], params={"batch": [256, 512], "width": [D // 4]},
                       tokens_per_step=lambda batch, width: batch,
                       model_flops=lambda batch, width: step_flops(batch, width),
                       workers=1, progress=False)
    assert len(swept) == 2
    for p in swept:
        batch = dict(p.params)["batch"]
        assert p.tokens_per_step == batch and p.model_flops == step_flops(batch, D // 4)
        e = p.estimate
        assert p.model_mfu() == pytest.approx(
            step_flops(batch, D // 4) / (16 * e.peak_flops * e.step_seconds))
        assert p.rank_seconds == pytest.approx(e.step_seconds / batch)
        assert p.name == f"fsdp 16, batch {batch}, width {D // 4}"
        row = p.row()
        assert row["batch"] == batch and row["tokens_per_step"] == batch
    # ranked by time per token, not per step
    assert swept[0].rank_seconds <= swept[1].rank_seconds
    text = str(swept)
    head = next(line for line in text.splitlines() if line.startswith("#  layout"))
    assert head.split()[:5] == ["#", "layout", "batch", "width", "devices"]
    assert "recommended: fsdp 16, batch" in text


def test_sweep_params_must_be_lists():
    with pytest.raises(ValueError, match=r"params\['batch'\] must be a non-empty list"):
        plan.sweep(build, [Layout.of(fsdp=16, topology=TOPOLOGY)], params={"batch": 8})


def test_matmul_flops_by_hand():
    jaxpr = jax.make_jaxpr(adam_like)(*build(Layout.of(fsdp=16, topology=TOPOLOGY))[1])
    assert matmul_flops(jaxpr) == {"bfloat16": step_flops(B)}

    def scanned(w, x):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, length=3)[0]
    a = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    assert matmul_flops(jax.make_jaxpr(scanned)(a, a)) == {"float32": 3 * 2 * 8 ** 3}


def matvec(w, x):
    """A product a matrix-vector step makes (decoding, say): 2 FLOPs per weight it reads."""
    return x @ w


def test_the_time_bound_counts_the_bytes_a_matmul_moves():
    """x bf16[8, D] @ w bf16[D, D]: its FLOPs take 2 * 8 * D^2 / peak, its weights alone
    2 * D^2 / the HBM's bandwidth, 50 times as long on a Trn2 (667 TFLOP/s over 2.9 TB/s
    is 230 FLOPs a byte; this matmul does 8): the bound is the bytes', below each plan's."""
    d = 16384
    w, x = (jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((d, d), (8, d)))
    work = matmul_work(jax.make_jaxpr(matvec)(w, x))
    moved = 2 * (d * d + 8 * d + 8 * d)
    assert work == {Matmul("bfloat16", 2.0 * 8 * d * d, moved): 1.0}
    for axes in ({"tp": 16}, {"fsdp": 16}, {"tp": 2}):
        layout = Layout.of(topology=TOPOLOGY, **axes)
        mesh = layout.make_mesh()
        step = jax_trn2.jit(matvec, in_shardings=(layout.sharding(mesh, "embed", "mlp"),
                                                  layout.sharding(mesh)),
                            topology=layout.topology)
        least = compute_seconds(work, layout)
        chip = layout.machine.device
        assert least == pytest.approx(moved / chip.hbm_bandwidth / layout.devices)
        assert least > compute_seconds({Matmul("bfloat16", 2.0 * 8 * d * d, 0): 1.0}, layout)
        assert least <= plan.estimate(step, (w, x), layout.machine).ideal_step_seconds, axes


def test_argument_bytes_and_the_shape_named():
    layout = Layout.of(fsdp=4, tp=4, topology=TOPOLOGY)
    jitted, args = build(layout)
    assert argument_bytes(layout, jitted, args) == 3 * D * W * 4 // 16 + B * D * 2 // 4
    odd = Layout.of(fsdp=2, tp=8, topology=TOPOLOGY)
    jitted, args = build(odd, width=12)
    with pytest.raises(ValueError, match=r"^tp=8 does not divide mlp \(12\): dimension 1 of "
                                         r"a \(65536, 12\) argument 0 split P\('fsdp', 'tp'\)"):
        argument_bytes(odd, jitted, args)


@pytest.fixture(scope="module")
def small_space():
    """Every dp x fsdp x tp of 16 and of 2 chips: planned in full, and searched."""
    layouts = grid(16, topologies=(TOPOLOGY,)) + grid(2, topologies=(TOPOLOGY,))
    full = plan.sweep(build, layouts, workers=1, progress=False)
    searched = plan.search(build, layouts, workers=1)
    return layouts, full, searched


def test_the_bounds_are_lower_bounds_of_the_full_plans(small_space):
    layouts, full, _ = small_space
    planned = [p for p in full if p.ok]
    assert len(planned) >= 10
    for p in planned:
        jitted, args = build(p.layout)
        assert argument_bytes(p.layout, jitted, args) <= p.estimate.peak_bytes, p.name
        least = compute_seconds(matmul_work(jitted.trace(*args).jaxpr), p.layout)
        assert 0 < least <= p.estimate.ideal_step_seconds <= p.estimate.step_seconds, p.name


def test_the_memory_floor_counts_a_top_level_matmul_with_the_resident_state(small_space):
    """adam_like's weight gradient x^T @ dy (bfloat16[D, 2 D], 16 GiB) is written while w,
    m and v (donated, read after it) and x are resident, as is its operand dy = (1 - y^2)
    (x @ w) -- no matmul's: only the result counts, over the 16 chips at most."""
    layouts, full, _ = small_space
    jitted, args = build(layouts[0])
    floor = memory_floor(jitted.trace(*args))
    assert max(i.live_bytes for i in floor.instants) == D * W * 2
    for p in full:
        if p.ok:
            jitted, args = build(p.layout)
            assert memory_lower_bound(p.layout, jitted, args) <= p.estimate.peak_bytes, p.name


def tanh_stack(m, x, w):
    """issue 40's step: four tanh(y @ w) on 1 GiB of activations beside a 2 GiB m."""
    y = x
    for _ in range(4):
        y = jnp.tanh(y @ w)
    return 0.9 * m + y.sum()


def build_tanh_stack(layout):
    mesh = layout.make_mesh()
    whole = layout.sharding(mesh)  # every device holds all of it
    step = jax_trn2.jit(tanh_stack, in_shardings=(whole,) * 3, out_shardings=whole,
                        topology=layout.topology)
    return step, (jax.ShapeDtypeStruct((2 ** 29,), jnp.float32),
                  jax.ShapeDtypeStruct((2 ** 15, 2 ** 14), jnp.bfloat16),
                  jax.ShapeDtypeStruct((2 ** 14, 2 ** 14), jnp.bfloat16))


def test_the_memory_floor_counts_each_matmul_result_with_the_resident_state():
    """m, x and w (3.5 GiB, not donated) stay the whole step; each y @ w writes 1 GiB of its
    own beside them (over the devices at most). Its operand y is a tanh's, not a matmul's
    (an elementwise chain a compiler may fuse into its reader): only the result counts."""
    result = 2 ** 15 * 2 ** 14 * 2
    arguments = 2 ** 29 * 4 + result + 2 ** 14 * 2 ** 14 * 2
    for layout in (Layout.of(tp=2, topology=TOPOLOGY), Layout.of(fsdp=16, topology=TOPOLOGY)):
        jitted, args = build_tanh_stack(layout)
        floor = memory_floor(jitted.trace(*args))
        assert [i.live_bytes for i in floor.instants] == [result] * 4
        least = memory_lower_bound(layout, jitted, args)
        assert least == arguments + result // layout.devices
        assert least <= plan.estimate(jitted, args, layout.machine).peak_bytes, layout.name


def test_a_search_prunes_only_what_cannot_fit_or_win(small_space):
    layouts, full, searched = small_space
    by_layout = {p.layout: p for p in full}
    counts = searched.counts()
    assert sum(counts.values()) == len(layouts)
    assert counts[MEMORY] > 0 and counts[TIME] > 0
    best = full.best
    assert searched.best.layout == best.layout  # the search finds the sweep's best
    assert searched.best.step_seconds == best.step_seconds
    for pruned in searched.pruned:
        truth = by_layout[pruned.variant.layout]
        if pruned.why == MEMORY:  # 3 x 32 GiB replicated over dp, say: truly too big
            assert not truth.fits and truth.estimate.peak_bytes >= pruned.bound > HBM
        elif pruned.why == TIME:  # truly no faster than the best
            assert truth.step_seconds >= pruned.bound and truth.step_seconds >= best.step_seconds
        else:
            assert pruned.why == SHAPE and not truth.ok
    text = str(searched)
    assert f"searched {len(layouts)} variants" in text and "planned in full" in text


# A deep linear-tanh stack trained by jax.grad, its layers run by a scan: the residuals its
# backward pass keeps (per-step outputs of the forward scan) outweigh its weights.
LAYERS, TOKENS, WIDTH = 8, 2 ** 20, 4096


def scanned(ws, x, remat=False):
    """A step of LAYERS tanh layers (ws f32[LAYERS, WIDTH, WIDTH]) on x bf16[TOKENS, WIDTH]."""
    def layer(h, w):
        return jnp.tanh(h @ w.astype(jnp.bfloat16)), None

    def loss(ws):
        h, _ = jax.lax.scan(jax.checkpoint(layer) if remat else layer, x, ws)
        return h.astype(jnp.float32).sum()
    return ws - 1e-3 * jax.grad(loss)(ws)


def build_scanned(layout, tokens=TOKENS):
    mesh = layout.make_mesh()
    ws = layout.sharding(mesh, None, "embed", "mlp")
    step = jax_trn2.jit(functools.partial(scanned, remat=layout.remat is not None),
                        in_shardings=(ws, layout.sharding(mesh, "batch", None)),
                        out_shardings=ws, donate_argnums=0, topology=layout.topology)
    return step, (jax.ShapeDtypeStruct((LAYERS, WIDTH, WIDTH), jnp.float32),
                  jax.ShapeDtypeStruct((tokens, WIDTH), jnp.bfloat16))


def test_the_memory_floor_by_hand():
    """Without remat the forward scan stacks, for each layer, its input h, its weight cast
    to bfloat16, its output y = tanh(h @ w) and 1 - y (tanh's derivative is 1 - y^2: jax
    keeps both), all bfloat16; with remat only h. The backward
    scan stacks each layer's weight gradient (float32) while it reads those."""
    h = LAYERS * TOKENS * WIDTH * 2
    cast = LAYERS * WIDTH * WIDTH * 2
    grads = LAYERS * WIDTH * WIDTH * 4
    for remat, forward in ((None, 3 * h + cast), ("full", h)):
        layout = Layout.of(fsdp=16, topology=TOPOLOGY, remat=remat)
        jitted, args = build_scanned(layout)
        floor = memory_floor(jitted.trace(*args))
        assert [i.live_bytes for i in floor.instants] == [forward, forward + grads], remat
        # the weights are donated and read after the forward scan (by the backward one):
        # at least their bytes over the 16 chips; x (not donated) as split
        weights, x = LAYERS * WIDTH * WIDTH * 4, TOKENS * WIDTH * 2
        assert floor.instants[0].donated == {0} and floor.held == {1}
        assert memory_lower_bound(layout, jitted, args) == \
            (forward + grads + weights) // 16 + x // 16


@pytest.fixture(scope="module")
def scanned_space():
    """Every dp x fsdp x tp of 16 chips and of 2, remat off and on, of the scanned step:
    planned in full, and searched."""
    layouts = grid(16, remats=(None, "full"), topologies=(TOPOLOGY,)) + \
        grid(2, remats=(None, "full"), topologies=(TOPOLOGY,))
    full = plan.sweep(build_scanned, layouts, workers=1, progress=False)
    searched = plan.search(build_scanned, layouts, workers=1)
    return layouts, full, searched


def test_the_memory_floor_is_a_lower_bound_of_the_full_plans(scanned_space):
    _, full, _ = scanned_space
    planned = [p for p in full if p.ok]
    assert len(planned) >= 10
    above_arguments = 0
    for p in planned:
        jitted, args = build_scanned(p.layout)
        least = memory_lower_bound(p.layout, jitted, args)
        assert least <= p.estimate.peak_bytes, p.name
        above_arguments += least > argument_bytes(p.layout, jitted, args)
    assert above_arguments == len(planned)  # the residuals count in every one


def test_a_search_prunes_by_the_activations_it_must_keep(scanned_space):
    layouts, full, searched = scanned_space
    by_layout = {p.layout: p for p in full}
    memory = [p for p in searched.pruned if p.why == MEMORY]
    assert memory
    for pruned in memory:
        truth = by_layout[pruned.variant.layout]
        jitted, args = build_scanned(pruned.variant.layout)
        assert argument_bytes(pruned.variant.layout, jitted, args) <= HBM  # not by arguments
        assert not truth.fits and truth.estimate.peak_bytes >= pruned.bound > HBM
    assert searched.best.layout == full.best.layout
    assert searched.best.step_seconds == full.best.step_seconds


# A Megatron MLP stack (w1 splits its mlp units over tp, w2 sums them back: the partitioner
# all-reduces each layer's output, so the activations a scan stacks for the backward pass
# are split over the batch axes only, never over tp).
MLP_LAYERS, MLP_TOKENS, MLP_WIDTH = 8, 2 ** 20, 8192  # each layer's input: bf16, 16 GiB


def mlp_stack(w1, w2, x, remat=False):
    def layer(h, w):
        up, down = (v.astype(jnp.bfloat16) for v in w)
        return h + jnp.tanh(h @ up) @ down, None

    def loss(ws):
        h, _ = jax.lax.scan(jax.checkpoint(layer) if remat else layer, x, ws)
        return h.astype(jnp.float32).sum()
    g1, g2 = jax.grad(loss)((w1, w2))
    return w1 - 1e-3 * g1, w2 - 1e-3 * g2


def build_mlp_stack(layout, width=MLP_WIDTH):
    mesh = layout.make_mesh()
    up = layout.sharding(mesh, None, "embed", "mlp")
    down = layout.sharding(mesh, None, "mlp", "embed")
    step = jax_trn2.jit(functools.partial(mlp_stack, remat=layout.remat is not None),
                        in_shardings=(up, down, layout.sharding(mesh, "batch", None)),
                        out_shardings=(up, down), donate_argnums=(0, 1),
                        topology=layout.topology)
    w = jax.ShapeDtypeStruct((MLP_LAYERS, width, width // 4), jnp.float32)
    return step, (w, jax.ShapeDtypeStruct(w.shape[:1] + w.shape[:0:-1], jnp.float32),
                  jax.ShapeDtypeStruct((MLP_TOKENS, width), jnp.bfloat16))


def partitioned_bound(jitted, args):
    """least_resident_bytes of the step's per-device program."""
    return least_resident_bytes(lowering.partitioned_module(jitted.trace(*args).stablehlo()))


@pytest.fixture(scope="module")
def mlp_space():
    """Every dp x fsdp x tp of 16 chips, remat off and on, of the MLP stack, in full."""
    layouts = grid(16, remats=(None, "full"), topologies=(TOPOLOGY,))
    return layouts, plan.sweep(build_mlp_stack, layouts, workers=1, progress=False)


def test_the_partitioned_bound_is_a_lower_bound_of_the_full_plans(mlp_space, scanned_space):
    """Over every layout of both scanned steps, remat off and on: never above the planned
    peak, and above the jaxpr's floor (which splits the stacked activations over every
    device) wherever tp leaves the activations whole."""
    tighter = 0
    for builder, (_, full, *_) in ((build_mlp_stack, mlp_space),
                                   (build_scanned, scanned_space)):
        planned = [p for p in full if p.ok]
        assert len(planned) >= 10
        for p in planned:
            jitted, args = builder(p.layout)
            least = partitioned_bound(jitted, args)
            assert argument_bytes(p.layout, jitted, args) <= least <= p.estimate.peak_bytes, \
                p.name
            tighter += least > memory_lower_bound(p.layout, jitted, args)
    assert tighter >= 8


def test_the_partitioned_bound_counts_the_stacked_layer_inputs_split_over_the_batch():
    """With remat each layer keeps its input h alone: bf16[TOKENS, WIDTH] per layer, split
    over dp x fsdp and not over tp; beside the weights, their gradients (f32) and x."""
    h = MLP_LAYERS * MLP_TOKENS * MLP_WIDTH * 2
    for kw, batch_split in ((dict(tp=16), 1), (dict(fsdp=4, tp=4), 4), (dict(dp=2, tp=8), 2)):
        layout = Layout.of(topology=TOPOLOGY, remat="full", **kw)
        jitted, args = build_mlp_stack(layout)
        least = partitioned_bound(jitted, args)
        assert least >= h // batch_split, layout.name
        assert memory_lower_bound(layout, jitted, args) < h // batch_split  # the jaxpr's
    # tp=16: 128 GiB of stacked inputs per chip, though 8 GiB split over all 16
    assert h > HBM > h // 16


def test_a_search_prunes_after_partitioning_what_cannot_fit_without_planning_it(mlp_space):
    """tp 16 (and tp 8 x dp 2, ...) cannot fit: the layer inputs the scan keeps are split
    over the batch axes only. The jaxpr's floor cannot see it; the worker partitions the
    step, reads their per-device size and prunes it there, never lowering it."""
    layouts, full = mlp_space
    searched = plan.search(build_mlp_stack, layouts, workers=1)
    by_layout = {p.layout: p for p in full}
    planned = {p.layout for p in searched}
    after = [p for p in searched.pruned if p.partitioned]
    assert "tp 16, remat full" in {p.variant.layout.name for p in after}
    for pruned in after:
        truth = by_layout[pruned.variant.layout]
        assert pruned.why == MEMORY and pruned.variant.layout not in planned
        assert not truth.fits and truth.estimate.peak_bytes >= pruned.bound > HBM
    assert searched.best.layout == full.best.layout
    assert searched.best.step_seconds == full.best.step_seconds
    assert f"({len(after)} of them once partitioned)" in str(searched)
