"""The native pass loop (mesh.isa.kernels.native) against the reference arithmetic of the
Tensor Engine's passes, written out in NumPy: each pass summed from +0.0 in FP32, passes
added in order into an FP32 accumulator; and its portable path against its AVX-512 code."""

import importlib.util
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lowering.host import host_devices
from mesh import isa
from mesh.isa.kernels import native

def reference_bf16(a: np.ndarray, b: np.ndarray, size: int) -> np.ndarray:
    """[M,K] x [K,N] of BF16 values: a pass is a chain of the host's BF16 dot instruction
    (VDPBF16PS) from +0.0 over pairs of contraction elements, which adds the pair's odd
    product, then its even one, each rounded to FP32 (products of BF16 values are exact);
    a pass of odd length ends with its last element paired with zero."""
    products = a.astype(np.float32)[:, :, None] * b.astype(np.float32)[None, :, :]
    acc = None
    for k0 in range(0, a.shape[1], size):
        part = products[:, k0:k0 + size]
        sums = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for j in range(0, part.shape[1], 2):
            sums = sums + (part[:, j + 1] if j + 1 < part.shape[1] else np.float32(0))
            sums = sums + part[:, j]
        acc = sums if acc is None else acc + sums
    return acc


def tables(shape, batch, rows, cols=None):
    """Offset tables of an array of `shape`: its batch dims, row dims, column dims."""
    return [native.offsets(shape, dims) for dims in (batch, rows, cols) if dims is not None]


def run(lhs, rhs, size, lhs_at, rhs_at, out_at, out_shape, portable=False, parts=1,
        out_dtype=jnp.float32):
    """The product (with `parts`: the list of its parts)."""
    device = host_devices(1)[0]
    fn = jax.jit(lambda l, r: native.pass_matmul(l, r, size, lhs_at, rhs_at, out_at, out_shape,
                                                 portable=portable, parts=parts,
                                                 out_dtype=out_dtype))
    results = [np.asarray(x) for x in fn(jax.device_put(lhs, device),
                                         jax.device_put(rhs, device))]
    return results if parts > 1 else results[0]


@pytest.mark.parametrize("m,k,n,size", [(5, 300, 7, 128), (9, 257, 33, 128), (1, 129, 1, 128),
                                        (17, 1000, 70, 128), (3, 45, 40, 9)])
def test_bf16_is_the_reference_arithmetic(rng, m, k, n, size):
    a = rng.standard_normal((m, k)).astype(jnp.bfloat16)
    b = rng.standard_normal((k, n)).astype(jnp.bfloat16)
    got = run(a[None], b[None], size, tables((1, m, k), [0], [1]),
              tables((1, k, n), [0], [1], [2]), tables((1, m, n), [0], [1], [2]), (1, m, n))
    np.testing.assert_array_equal(got[0].view(np.uint32),
                                  reference_bf16(a, b, size).view(np.uint32))


def test_fp32_sums_each_pass_in_contraction_order():
    """Pass 1: 2^24 then 127 ones, each one lost to rounding (2^24 + 1 rounds to 2^24);
    pass 2: 128 ones, summed exactly from zero, then added: 2^24 + 128. One chain over all
    256 would lose every one (2^24); a pass summed in another order would keep some."""
    a = np.ones((1, 1, 256), np.float32)
    a[0, 0, 0] = 2.0 ** 24
    b = np.ones((1, 256, 1), np.float32)
    got = run(a, b, 128, tables(a.shape, [0], [1]), tables(b.shape, [0], [1], [2]),
              tables((1, 1, 1), [0], [1], [2]), (1, 1, 1))
    assert got.item() == 2.0 ** 24 + 128


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_an_element_depends_only_on_its_row_and_column(rng, dtype):
    """As a column of the PE array sums its own products: the same row and column give the
    same bits within any shape of product."""
    a = rng.standard_normal((1, 40, 640)).astype(dtype)
    b = rng.standard_normal((1, 640, 100)).astype(dtype)

    def product(m, n):
        lhs, rhs = np.ascontiguousarray(a[:, :m]), np.ascontiguousarray(b[:, :, :n])
        return run(lhs, rhs, 128, tables(lhs.shape, [0], [1]), tables(rhs.shape, [0], [1], [2]),
                   tables((1, m, n), [0], [1], [2]), (1, m, n))

    whole = product(40, 100)
    for m, n in [(1, 1), (7, 9), (40, 33), (8, 100)]:
        np.testing.assert_array_equal(product(m, n), whole[:, :m, :n])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("batch", [1, 3, 16])  # threads share one element; take whole ones
def test_layouts_give_the_same_sums(rng, dtype, batch):
    """Operands and result read and written where they are (rhs [B,N,K], the result
    [N,B,M]) give the bits of contiguous [B,M,K] x [B,K,N] -> [B,M,N], and the float64
    product to FP32 accuracy."""
    m, k, n = 20, 384, 45
    a = rng.standard_normal((batch, m, k)).astype(dtype)
    b = rng.standard_normal((batch, k, n)).astype(dtype)
    plain = run(a, b, 128, tables(a.shape, [0], [1]), tables(b.shape, [0], [1], [2]),
                tables((batch, m, n), [0], [1], [2]), (batch, m, n))
    b_nk = np.ascontiguousarray(b.transpose(0, 2, 1))
    moved = run(a, b_nk, 128, tables(a.shape, [0], [1]), tables(b_nk.shape, [0], [2], [1]),
                tables((n, batch, m), [1], [2], [0]), (n, batch, m))
    np.testing.assert_array_equal(moved.transpose(1, 2, 0).view(np.uint32),
                                  plain.view(np.uint32))
    exact = np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(plain, exact, rtol=0, atol=1e-4 * np.abs(exact).max())


def extremes(rng, shape, dtype):
    """Values of every exponent (subnormal ones, and products beyond FP32's range), with
    zeros of both signs, infinities and NaN among them."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-140, 120, shape))
    pick = rng.random(shape)
    for value, share in ((np.inf, 0.01), (-np.inf, 0.01), (np.nan, 0.005), (0.0, 0.02),
                         (-0.0, 0.02), (2.0 ** -130, 0.02)):
        x[pick < share] = value
        pick[pick < share] = 1.0
        pick -= share
    return x.astype(dtype)


def bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.uint16 if x.dtype.itemsize == 2 else np.uint32)


def same_bits_or_both_nan(got, want):
    """Equal bits, except that a NaN may be another NaN: which NaN a sum of NaNs gives
    depends on the order in which the compiler hands the instruction its operands."""
    nan = np.isnan(want.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("batch,m,k,n,size", [
    (1, 1, 300, 1, 128),     # one row and column, a short last pass
    (1, 1, 300, 64, 128),
    (2, 64, 512, 96, 128),
    (3, 9, 45, 40, 9),       # K < 128, several odd passes
    (1, 5, 50, 7, 16),       # a last pass of 2
    (1, 130, 1100, 33, 128),  # several blocks of rows (BF16: 112 rows, FP32: 56)
    (16, 11, 257, 35, 128),  # batch elements enough for each thread to take whole ones
])
@pytest.mark.parametrize("values", ["normal", "extremes"])
def test_portable_path_gives_the_avx512_bits(rng, dtype, batch, m, k, n, size, values):
    if not native.avx512(dtype):
        pytest.skip("this CPU runs the portable path only")
    make = extremes if values == "extremes" else (
        lambda rng, shape, dtype: rng.standard_normal(shape).astype(dtype))
    a, b = make(rng, (batch, m, k), dtype), make(rng, (batch, k, n), dtype)
    layouts = [(b, tables(b.shape, [0], [1], [2]), tables((batch, m, n), [0], [1], [2]),
                (batch, m, n))]
    b_nk = np.ascontiguousarray(b.transpose(0, 2, 1))  # strided columns, a strided result
    layouts.append((b_nk, tables(b_nk.shape, [0], [2], [1]), tables((n, batch, m), [1], [2], [0]),
                    (n, batch, m)))
    for rhs, rhs_at, out_at, out_shape in layouts:
        fast, portable = (run(a, rhs, size, tables(a.shape, [0], [1]), rhs_at, out_at, out_shape,
                              portable=p) for p in (False, True))
        same_bits_or_both_nan(portable, fast)
        if values == "normal":
            assert not np.isnan(fast).any()


@pytest.mark.parametrize("operand", ["lhs", "rhs", "result"])
def test_offsets_outside_a_buffer_are_an_error(operand):
    a, b = np.ones((1, 4, 200), np.float32), np.ones((1, 200, 3), np.float32)
    at = {"lhs": tables(a.shape, [0], [1]), "rhs": tables(b.shape, [0], [1], [2]),
          "result": tables((1, 4, 3), [0], [1], [2])}
    last = at[operand][-1]  # rows (lhs) or columns: each one element further than the last
    at[operand][-1] = last._replace(strides=(last.strides[0] + 1,))
    with pytest.raises(Exception, match=f"{operand}'s offsets reach outside"):
        run(a, b, 128, at["lhs"], at["rhs"], at["result"], (1, 4, 3))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_a_result_in_parts_has_the_bits_of_the_whole(rng, dtype):
    """A result of 2 x 3 chips' pieces as one array per chip, each chip's columns (a row of
    the loop's result) spread over 3 chips: the same bits as one array."""
    chips, m, k, n = (2, 3), 16, 256, 64
    a = rng.standard_normal((2, m, k)).astype(dtype)  # varies along the first mesh axis
    b = rng.standard_normal((3, k, n)).astype(dtype)  # along the second
    shape = chips + (m, n)
    args = (a, b, 128, tables(a.shape, [], [0, 1]), tables(b.shape, [], [1], [0, 2]))
    whole = run(*args, tables(shape, [], [0, 2], [1, 3]), shape)
    parts = run(*args, tables(shape, [], [0, 2], [1, 3]), shape, parts=6)
    assert [p.shape for p in parts] == [(m, n)] * 6
    np.testing.assert_array_equal(np.stack(parts).reshape(shape).view(np.uint32),
                                  whole.view(np.uint32))


def rounding_cases() -> np.ndarray:
    """FP32 values where a rounding to BF16 can go wrong: every exponent (subnormals among
    them) with significands just below, at and just above a tie, even and odd; the largest
    values and those that round past BF16's largest; zeros, infinities and NaNs with and
    without payloads, quiet and signalling, of both signs."""
    exponents = np.arange(256, dtype=np.uint32) << 23
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x18000, 0x17FFF, 0x7F7FFF,
                    0x7F8000, 0x7FFFFF, 0x400000, 0x400001, 0x10000, 0x3F0000], np.uint32)
    cases = (exponents[:, None] | low[None, :]).reshape(-1)
    return np.concatenate([cases, cases | np.uint32(1 << 31)]).view(np.float32)


@pytest.mark.parametrize("portable", [False, True])
def test_rounding_to_bf16_is_xla_s(portable):
    """The loop's rounding of a BF16 result, bit for bit XLA:CPU's conversion (checked
    over every FP32 value by benchmarks/bf16_rounding.py): ties to even, subnormals kept,
    overflow to infinity, a NaN to the quiet NaN of its sign."""
    x = rounding_cases()[:-5]  # and a last tile of 27 values
    want = np.asarray(jax.jit(lambda v: v.astype(jnp.bfloat16))(x))
    np.testing.assert_array_equal(bits(native.round_to_bf16(x, portable=portable)), bits(want))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("portable", [False, True])
def test_a_bf16_result_is_its_sums_rounded_as_xla_rounds_them(rng, dtype, portable):
    """A BF16 result of values of every exponent (extremes), in one array or in parts,
    contiguous or strided (its rows in tiles held apart and rounded once): XLA:CPU's
    conversion of the FP32 result, bit for bit, the signs of NaNs too (its passes are
    added in the FP32 result's order: which NaN a sum of two NaNs keeps depends on it)."""
    a, b = extremes(rng, (2, 40, 300), dtype), extremes(rng, (2, 300, 64), dtype)
    lhs_at, rhs_at = tables(a.shape, [0], [1]), tables(b.shape, [0], [1], [2])
    for out_at, out_shape, parts in [(tables((2, 40, 64), [0], [1], [2]), (2, 40, 64), 1),
                                     (tables((2, 40, 64), [0], [1], [2]), (2, 40, 64), 2),
                                     (tables((64, 2, 40), [1], [2], [0]), (64, 2, 40), 1)]:
        sums, rounded = (run(a, b, 128, lhs_at, rhs_at, out_at, out_shape, portable=portable,
                             parts=parts, out_dtype=t) for t in (jnp.float32, jnp.bfloat16))
        if parts > 1:
            sums, rounded = np.stack(sums), np.stack(rounded)
        assert rounded.dtype == jnp.bfloat16
        want = np.asarray(jax.jit(lambda v: v.astype(jnp.bfloat16))(sums))
        np.testing.assert_array_equal(bits(rounded), bits(want))


def test_the_offsets_are_no_arrays_of_the_program():
    """The loop makes its offset tables from the dims' sizes and strides: XLA compiles an
    array argument that is a constant of the program into kernels of its own (an iota
    each), which cost more to compile than the loop takes to make the tables."""
    a, b = np.ones((2, 40, 300), np.float32), np.ones((2, 300, 64), np.float32)
    device = host_devices(1)[0]
    fn = jax.jit(lambda l, r: native.pass_matmul(
        l, r, 128, tables(a.shape, [0], [1]), tables(b.shape, [0], [1], [2]),
        tables((64, 2, 40), [1], [2], [0]), (64, 2, 40)))
    text = fn.lower(*(jax.device_put(x, device) for x in (a, b))).compile().as_text()
    assert native.TARGET in text and "s64[" not in text


def test_offsets_of_other_than_eight_tables_are_an_error():
    a, b = np.ones((1, 4, 200), np.float32), np.ones((1, 200, 3), np.float32)
    with pytest.raises(ValueError, match="not 2, 2 and 3"):
        run(a, b, 128, tables(a.shape, [0], [1]), tables(b.shape, [0], [1]),
            tables((1, 4, 3), [0], [1], [2]), (1, 4, 3))


def test_a_result_of_another_type_is_an_error():
    a, b = np.ones((1, 4, 200), np.float32), np.ones((1, 200, 3), np.float32)
    with pytest.raises(ValueError, match="FP32 or BF16, not float16"):
        run(a, b, 128, tables(a.shape, [0], [1]), tables(b.shape, [0], [1], [2]),
            tables((1, 4, 3), [0], [1], [2]), (1, 4, 3), out_dtype=jnp.float16)


def test_a_row_of_a_tile_across_two_parts_is_an_error():
    """Parts of 24 elements, rows of 32 columns: a tile's row would be written past the
    end of a part."""
    a, b = np.ones((1, 3, 200), np.float32), np.ones((1, 200, 32), np.float32)
    at = (tables(a.shape, [0], [1]), tables(b.shape, [0], [1], [2]),
          tables((1, 3, 32), [0], [1], [2]))
    with pytest.raises(Exception, match="spans two parts"):
        run(a, b, 128, *at, (4, 24), parts=4)
    with pytest.raises(ValueError, match="5 parts are not blocks"):
        run(a, b, 128, *at, (4, 24), parts=5)


def test_without_the_built_library_importing_is_an_error(tmp_path):
    shutil.copy(native.__file__, tmp_path / "native.py")  # a directory without the library
    spec = importlib.util.spec_from_file_location("unbuilt_native", tmp_path / "native.py")
    with pytest.raises(ImportError, match="pip install -e ."):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def test_off_cpu_executor_devices_a_matmul_runs_as_host_gemms(rng):
    """Where the executor's devices are not CPUs the native loop (a CPU custom call) cannot
    run: the matmul is host GEMMs, one per pass, traced alone (the CPU's kernel is not
    traced as well)."""
    import jax_trn2
    from mesh import executor
    from mesh.isa.kernels import matmul

    x = rng.standard_normal((4, 300)).astype(np.float32)
    w = rng.standard_normal((300, 8)).astype(np.float32)
    program = jax_trn2.jit(lambda x, w: x @ w).lower(x, w).compile().executable.program
    (product,) = [i for i in program.instructions if isinstance(i, isa.Matmul)]
    assert matmul.runs_natively(product, program, on_cpu=True)
    assert not matmul.runs_natively(product, program, on_cpu=False)
    args = [jnp.asarray(a).reshape(program.array_shape(v)) for a, v in
            zip((x, w), program.inputs)]
    texts, results = {}, {}
    for on_cpu in (True, False):
        run = jax.jit(lambda *a: executor.run_program(program, a, on_cpu=on_cpu))
        texts[on_cpu] = run.lower(*args).as_text()
        results[on_cpu] = np.asarray(run(*args)[0]).reshape(4, 8)
    assert native.TARGET in texts[True] and native.TARGET not in texts[False]
    # Both sum 300 FP32 products in 3 passes, in different orders within a pass: each
    # within 300 roundings of the sum of |products| (2^-24 each) of the exact result.
    exact = x.astype(np.float64) @ w.astype(np.float64)
    bound = 300 * 2.0 ** -24 * (np.abs(x).astype(np.float64) @ np.abs(w))
    for result in results.values():
        assert np.all(np.abs(result - exact) <= bound)


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16])
def test_a_single_pass_gives_the_same_bits_however_the_chips_are_split(rng, dtype):
    """Matmuls of one pass (K <= 128) run in the native loop too: each executor device (or
    process) computes its chips' rows, and a host GEMM of another row count may add in
    another order; the loop's bits do not depend on it."""
    import jax_trn2
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax_trn2.make_mesh((4, 2), ("data", "model"))
    x = rng.standard_normal((200, 96)).astype(dtype)
    w = rng.standard_normal((96, 120)).astype(dtype)
    f = lambda x, w: jnp.tanh(x @ w) @ w.T  # noqa: E731 (K = 96, then 120)
    results = [np.asarray(jax_trn2.jit(f, in_shardings=(NamedSharding(mesh, P("data")), None),
                                       executor_devices=jax.devices("cpu")[:n])(x, w))
               for n in (1, 2, 4, 8)]
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])
