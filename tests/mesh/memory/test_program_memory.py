"""memory_analysis, donation, the out-of-HBM error and the HBM counter track, through jit."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2
from mesh import memory
from mesh.perf import trace

GIB = 2**30
F = 1024 * 1024 * 4  # one float32[1024,1024]
SQUARE = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes")


def add(a, b):
    return a + b


def test_memory_analysis_has_jax_fields():
    stats = jax_trn2.jit(add).lower(SQUARE, SQUARE).compile().memory_analysis()
    assert all(isinstance(getattr(stats, name), int) for name in FIELDS)
    # a, b and their sum, all held for the whole step.
    assert (stats.argument_size_in_bytes, stats.output_size_in_bytes) == (2 * F, F)
    assert stats.peak_memory_in_bytes == 3 * F and stats.alias_size_in_bytes == 0


def test_donating_an_argument_lowers_the_peak():
    # The sum is written into the donated a, as XLA reuses a donated buffer.
    stats = jax_trn2.jit(add, donate_argnums=0).lower(SQUARE, SQUARE).compile().memory_analysis()
    assert stats.peak_memory_in_bytes == 2 * F and stats.alias_size_in_bytes == F


@pytest.mark.parametrize("donation", [dict(donate_argnames="a"), dict(donate_argnums=0)],
                         ids=["by-name", "by-position"])
@pytest.mark.parametrize("passed", ["positionally", "by-keyword"])
def test_donating_by_name_or_position_donates_the_argument_passed_either_way(donation, passed):
    # As jax.jit: donate_argnames alone also donates `a` passed by position, and
    # donate_argnums alone `a` passed by keyword.
    step = jax_trn2.jit(add, **donation)
    lowered = step.lower(SQUARE, SQUARE) if passed == "positionally" else \
        step.lower(a=SQUARE, b=SQUARE)
    assert lowered.memory_analysis().alias_size_in_bytes == F


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
@pytest.mark.parametrize("f", [lambda a, b: (a.reshape(512, 2048) * 2, b + 1),
                               lambda a, b: ((a * 2).astype(jnp.int32), b.astype(jnp.bfloat16)),
                               lambda a, b: (b * 2, a.T.astype(jnp.int32))],
                         ids=["reshaped", "same-size-dtype", "after-jax-aliases"])
def test_donated_buffers_pair_with_outputs_of_as_many_bytes_as_xla_pairs_them(f):
    # A donated argument jax cannot alias to an output of its own type (jax.buffer_donor)
    # takes, as in XLA, the first free output of as many bytes, whatever its shape and type
    # (a bfloat16 result is half a float32 argument: no alias); jax's own aliases come first.
    want = jax.jit(f, donate_argnums=(0, 1)).lower(SQUARE, SQUARE).compile().memory_analysis()
    got = jax_trn2.jit(f, donate_argnums=(0, 1)).lower(SQUARE, SQUARE).memory_analysis()
    assert got.alias_size_in_bytes == want.alias_size_in_bytes


@pytest.mark.parametrize("f, donate, peak", [  # (b unused: jax.jit drops it)
    (lambda a, b: a, (), 2 * F),               # a, and the output copy of a
    (lambda a, b: a.reshape(-1), (), 2 * F),   # a view of a is copied as well
    (lambda a, b: (a + b, a + b), (), 4 * F),  # a, b, the sum, and its copy
    (lambda a, b: (a, a), (0,), 2 * F),        # the first output takes donated a, then a copy
    (lambda a, b: a, (0,), F),                 # returned into its own donated buffer
    # exp is written in place into the product, and is returned: x + 1 may not overwrite it
    (lambda a, b: (jnp.exp(a @ b), jnp.exp(a @ b) + 1), (), 4 * F),
], ids=["argument", "view-of-argument", "same-value-twice", "donated-twice", "donated",
        "output-stored-in-a-temporary"])
def test_every_output_has_a_buffer_of_its_own(f, donate, peak):
    # XLA's copy insertion gives each output of the step its own buffer: an argument the
    # caller keeps, or a value returned twice, is copied (as CPU XLA's memory_analysis shows).
    stats = jax_trn2.jit(f, donate_argnums=donate).lower(SQUARE, SQUARE).memory_analysis()
    assert stats.peak_memory_in_bytes == peak
    assert stats.peak_memory_in_bytes >= stats.argument_size_in_bytes + \
        stats.output_size_in_bytes - stats.alias_size_in_bytes


def test_shard_map_chips_hold_their_slices():
    # x float32[4096,1024] split over x (4) and y (4) -> [1024,256] per chip; w [1024,1024]
    # replicated; the per-chip product [1024,1024] is assembled into the output.
    mesh = jax_trn2.make_mesh()
    f = jax.shard_map(lambda x, w: w @ x, mesh=mesh, in_specs=(P(None, ("x", "y")), P()),
                      out_specs=P(None, ("x", "y")))
    x = jax.ShapeDtypeStruct((1024, 16 * 256), jnp.float32)
    stats = jax_trn2.jit(f).lower(x, SQUARE).memory_analysis()
    piece = 1024 * 256 * 4
    assert stats.argument_size_in_bytes == piece + F
    assert stats.output_size_in_bytes == piece
    assert stats.peak_memory_in_bytes == piece + F + piece
    chips = jax_trn2.jit(f).lower(x, SQUARE).compile().executable.estimate.memory.per_chip()
    assert len(chips) == 64 and len({s.peak_memory_in_bytes for s in chips.values()}) == 1


def too_big(x):
    y = jnp.broadcast_to(x, (120_000, 120_000))  # float32: 53.6 GiB
    return jnp.transpose(y) + 1.0  # another 53.6 GiB beside it


def test_out_of_hbm_names_chips_sizes_and_source_lines():
    lowered = jax_trn2.jit(too_big).lower(jax.ShapeDtypeStruct((), jnp.float32))
    assert "Transpose" in lowered.as_text()  # lowering and inspection still work
    assert lowered.cost_analysis()["flops"] > 0
    stats = lowered.memory_analysis()
    assert stats.peak_memory_in_bytes > 96 * GIB and not stats.fits
    with pytest.raises(jax_trn2.OutOfHBMError) as error:
        lowered.compile()
    message = str(error.value)
    assert re.search(r"needs 107\.\d\d GiB of HBM per chip .* than the 96\.00 GiB", message)
    assert "float32[120000,120000] (53.64 GiB)" in message
    assert f"test_program_memory.py:{too_big.__code__.co_firstlineno + 1}" in message
    assert error.value.chips == (0,) and error.value.stats.peak_memory_in_bytes > 96 * GIB
    compiled = lowered.compile(check_memory=False)  # told not to check: it compiles
    assert compiled.memory_analysis().peak_memory_in_bytes == stats.peak_memory_in_bytes
    # told so as jax.jit on the plugin is told: by compile, or by the jit's compiler options
    lowered.compile({"trn2_check_memory": False})
    unchecked = jax_trn2.jit(too_big, compiler_options={"trn2_check_memory": False})
    unchecked.lower(jax.ShapeDtypeStruct((), jnp.float32)).compile()
    # a value that is not a bool does not quietly turn the check off; nor does one of two
    for not_a_bool in (None, 0.0, "no"):
        with pytest.raises(ValueError, match="trn2_check_memory: expected true or false"):
            lowered.compile({"trn2_check_memory": not_a_bool})
    with pytest.raises(ValueError, match="check_memory given twice"):
        lowered.compile({"trn2_check_memory": False}, check_memory=True)
    with pytest.raises(TypeError, match="compiler_options: expected a mapping"):
        lowered.compile("trn2_check_memory=false")


def test_calling_a_program_that_does_not_fit_raises():
    with pytest.raises(jax_trn2.OutOfHBMError, match=r"on chip 0\)"):
        jax_trn2.jit(too_big)(np.float32(1.0))


def test_the_client_compiler_refuses_a_program_that_does_not_fit():
    # PJRT's compile fails with RESOURCE_EXHAUSTED; so does the client's, unless told not
    # to check.
    stablehlo = jax.jit(too_big).lower(jax.ShapeDtypeStruct((), jnp.float32)).as_text()
    client = jax_trn2.client()
    with pytest.raises(jax_trn2.OutOfHBMError, match=r"needs 107\.\d\d GiB"):
        client.compile(stablehlo)
    assert not client.compile(stablehlo, check_memory=False).memory_analysis().fits


def test_out_of_hbm_on_every_chip_of_a_mesh():
    mesh = jax_trn2.make_mesh()
    f = jax.shard_map(lambda a: a @ a.T, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    a = jax.ShapeDtypeStruct((4 * 150_000, 100_000), jnp.float32)  # 55.9 GiB per chip
    with pytest.raises(jax_trn2.OutOfHBMError, match=r"on chips 0-63\)"):
        jax_trn2.jit(f).lower(a).compile()


def transposes(a):
    return jnp.transpose(jnp.transpose(a) * 2.0)


def test_trace_has_an_hbm_counter_per_chip():
    # a (whole step), a.T*2 (until the second transpose ends), the result (to the end):
    # 3 F while the second transpose runs, 2 F at the end of the step.
    mesh = jax_trn2.make_mesh()
    f = jax.shard_map(transposes, mesh=mesh, in_specs=P(), out_specs=P())
    estimate = jax_trn2.jit(f).lower(SQUARE).compile().executable.estimate
    events = trace.chrome_trace(estimate, chips=[0, 5])["traceEvents"]
    counter = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counter} == {"HBM"} and {e["pid"] for e in counter} == {0, 5}
    chip0 = [e for e in counter if e["pid"] == 0]
    assert [e["ts"] for e in chip0] == sorted(e["ts"] for e in chip0)
    assert max(e["args"]["GiB"] for e in chip0) == pytest.approx(3 * F / GIB, rel=1e-12)
    assert chip0[-1]["args"]["GiB"] == pytest.approx(2 * F / GIB, rel=1e-12)
    assert chip0[-1]["ts"] == pytest.approx(estimate.step_seconds * 1e6, rel=1e-12)


def test_listing_summary_shows_the_peak():
    text = jax_trn2.jit(add).lower(SQUARE, SQUARE).compile().as_text()
    assert "HBM per chip: peak 12.00 MiB of 96.00 GiB" in text
    assert "float32[1024,1024] (4.00 MiB) argument 'a'" in text


@pytest.mark.parametrize("trips", [2, 50])
def test_a_fori_loop_holds_its_state_once_whatever_the_trip_count(trips):
    # Arguments x and w; the loop's state copy of x (a non-donated argument cannot be
    # overwritten), which becomes the output; one x @ w result inside the body: 4 F (plus
    # the loop counter's bytes) for any trip count. jax carries w through the loop, but the
    # body never changes it, so it stays in the argument's buffer (XLA:CPU copies x, not w).
    def f(x, w):
        return jax.lax.fori_loop(0, trips, lambda i, x: jnp.tanh(x @ w), x)
    stats = jax_trn2.jit(f).lower(SQUARE, SQUARE).memory_analysis()
    assert 4 * F <= stats.peak_memory_in_bytes < 4 * F + 64
    assert any(b.kind == "inside" and b.nbytes == F for b in stats.live_at_peak)


def test_partitioned_programs_keep_donation_and_hold_pieces():
    # a and b split 64 ways by rows: each chip holds 16 rows of each, and the donated a's
    # piece takes the sum: 2 pieces per chip at the peak.
    mesh = jax_trn2.make_mesh()
    rows = jax.sharding.NamedSharding(mesh, P(("x", "y", "z")))
    step = jax_trn2.jit(add, in_shardings=(rows, rows), out_shardings=rows, donate_argnums=0)
    stats = step.lower(SQUARE, SQUARE).memory_analysis()
    piece = F // 64
    assert stats.argument_size_in_bytes == 2 * piece and stats.output_size_in_bytes == piece
    assert stats.alias_size_in_bytes == piece and stats.peak_memory_in_bytes == 2 * piece


S = 64 * 64 * 4  # bytes of one step's float32[64,64]
SCAN_MODULE = """
func.func public @main(%x: tensor<{trips}x64x64xf32>, %c0: tensor<64x64xf32>)
    -> (tensor<{trips}x64x64xf32>, tensor<64x64xf32>) {{
  %init = stablehlo.transpose %c0, dims = [1, 0] : (tensor<64x64xf32>) -> tensor<64x64xf32>
  %0:2 = chlo.scan(%x) inits(%init) dimension=0 {{
  ^bb0(%e: tensor<64x64xf32>, %c: tensor<64x64xf32>):
    %y = stablehlo.transpose %e, dims = [1, 0] : (tensor<64x64xf32>) -> tensor<64x64xf32>
    %both = stablehlo.concatenate %c, %e, dim = 0
      : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<128x64xf32>
    %next = stablehlo.slice %both [32:96, 0:64] : (tensor<128x64xf32>) -> tensor<64x64xf32>
    stablehlo.return %y, %next : tensor<64x64xf32>, tensor<64x64xf32>
  }} : (tensor<{trips}x64x64xf32>, tensor<64x64xf32>)
    -> (tensor<{trips}x64x64xf32>, tensor<64x64xf32>)
  return %0#0, %0#1 : tensor<{trips}x64x64xf32>, tensor<64x64xf32>
}}"""


@pytest.mark.parametrize("trips", [2, 8])
def test_a_chlo_scan_holds_its_carry_once_and_its_body_temporaries(trips):
    # Held for the whole step: x (trips S), c0 (S) and the stacked outputs (trips S). The
    # carry is one buffer (S): the initial T(c0) dies at the scan, which writes its final
    # carry there. Inside the body, beside its slice of x, its carry and the per-step
    # output y (which goes into the stacked outputs), the concatenation (2 S) lives while
    # it is made from the carry: 2 trips S + 4 S, whatever the trip count.
    stats = jax_trn2.client().compile(SCAN_MODULE.format(trips=trips)).memory_analysis()
    assert stats.peak_memory_in_bytes == 2 * trips * S + 4 * S
    (inside,) = [b for b in stats.live_at_peak if b.kind == "inside"]
    assert (inside.what, inside.nbytes) == ("scan body", 2 * S)


def test_a_composite_adds_its_decomposition_temporaries():
    @functools.partial(jax.lax.composite, name="my.middle_rows")
    def middle_rows(x):
        return jnp.concatenate([x, x])[32:96]

    # x, x.T and the composite's result (S each), and inside the decomposition the
    # concatenation (2 S) beside them: 5 S.
    f = jax_trn2.jit(lambda x: middle_rows(x.T).T)
    stats = f.lower(jax.ShapeDtypeStruct((64, 64), jnp.float32)).memory_analysis()
    assert stats.peak_memory_in_bytes == 5 * S
    (inside,) = [b for b in stats.live_at_peak if b.kind == "inside"]
    assert (inside.what, inside.nbytes) == ("my.middle_rows decomposition", 2 * S)


def test_a_scan_reads_its_stacked_inputs_in_place():
    # jax carries xs through the scan's loop unchanged: it stays in the argument's buffer.
    # Arguments c (donated: the final carry takes its buffer) and xs (10 F); the per-step
    # sums (40 bytes) and, inside the body, one new carry (F): 11 F + F + a few bytes.
    def step(c, xs):
        return jax.lax.scan(lambda c, x: (c * 0.9 + x, c.sum()), c, xs)
    stats = jax_trn2.jit(step, donate_argnums=0).lower(
        SQUARE, jax.ShapeDtypeStruct((10, 1024, 1024), jnp.float32)).memory_analysis()
    assert stats.argument_size_in_bytes == 11 * F and stats.alias_size_in_bytes == F
    assert 12 * F <= stats.peak_memory_in_bytes < 12 * F + 64


def test_running_out_of_host_memory_is_named_as_such():
    """The chips fit (the model fuses the broadcast product into its reduction) but the
    simulator, which makes the 2^19 x 2^19 product whole (1 TiB), cannot allocate it."""
    x = jnp.ones((1 << 19,), jnp.float32)
    f = jax_trn2.jit(lambda x: jnp.sum(jnp.sin(x[:, None] * x[None, :]), 0))
    assert f.lower(x).memory_analysis().peak_memory_in_bytes < 1 << 30
    with pytest.raises(jax_trn2.HostMemoryError, match="the host ran out of memory running "
                                                       "the simulation of 1 chip .*The chips fit"):
        f(x)


def test_the_peak_of_a_training_step_split_by_what_holds_it():
    """A step of SGD with momentum on w (donated with its momentum m, 4 MiB each) for a
    batch x (16 MiB). Its peak is the gradient's matmul g = x^T @ dh, which holds x, the
    state, dh = d loss / d(x @ w) (16 MiB: the forward product, overwritten in place) and
    g (4 MiB): 8 MiB donated + 16 MiB other arguments + 0 outputs + 20 MiB temporaries."""
    def step(state, x):
        w, m = state["w"], state["m"]
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(w)
        m = 0.9 * m + g
        return {"w": w - 0.1 * m, "m": m}

    x = jax.ShapeDtypeStruct((4096, 1024), jnp.float32)
    for stats in (jax_trn2.jit(step, donate_argnums=0).lower({"w": SQUARE, "m": SQUARE}, x)
                  .memory_analysis(),
                  jax_trn2.jit(step, donate_argnums=0).lower({"w": SQUARE, "m": SQUARE}, x)
                  .compile().memory_analysis()):
        split = stats.peak_split
        assert (split.donated_arguments, split.other_arguments, split.outputs,
                split.temporaries) == (2 * F, 4 * F, 0, 5 * F)
        assert split.total == stats.peak_memory_in_bytes == 11 * F


def _training_step(state, x):
    g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) ** 2))(state["w"])
    m = 0.9 * state["m"] + g
    return {"w": state["w"] - 0.1 * m, "m": m}


@pytest.mark.parametrize("f, args, donate", [
    (lambda a, b: (a, a), (SQUARE, SQUARE), ()),  # an output copied
    (lambda a, b: jax.lax.fori_loop(0, 3, lambda i, x: jnp.tanh(x @ b), a), (SQUARE, SQUARE),
     ()),
    (lambda c, xs: jax.lax.scan(lambda c, x: (c * 0.9 + x, c.sum()), c, xs),
     (SQUARE, jax.ShapeDtypeStruct((4, 1024, 1024), jnp.float32)), (0,)),
    (_training_step, ({"w": SQUARE, "m": SQUARE}, jax.ShapeDtypeStruct((4096, 1024),
                                                                        jnp.float32)), (0,)),
    (lambda a, b: jax.lax.cond(a[0, 0] > 0, lambda: a @ b, lambda: (a + b).T),
     (SQUARE, SQUARE), ()),
], ids=["copied-output", "fori-loop", "scan", "training-step", "cond"])
def test_the_bound_that_spares_the_memory_check_is_never_below_the_peak(f, args, donate):
    # check_memory skips the schedule and liveness where this bound fits in HBM: it must
    # never be below the peak the exact analysis finds
    executable = jax_trn2.jit(f, donate_argnums=donate).lower(*args).compile().executable
    peak = executable.estimate.memory.stats().peak_memory_in_bytes
    assert peak <= memory.bytes_bound(executable.program)
