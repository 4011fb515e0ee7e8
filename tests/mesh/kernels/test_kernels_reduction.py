"""The Vector engine's reduce kernel (mesh.isa.kernels.reduction) called directly: narrow
floats widened to FP32, reduced, combined with the init value and rounded once."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from kernel_harness import bits, kernel_call, run_kernel

from mesh import isa
from mesh.isa.kernels import kernel_for


def reduce(dimensions, combiner):
    return lambda outs, ins: isa.Reduce(outs, ins, dimensions=dimensions, combiner=combiner)


def test_bf16_sum_is_taken_in_fp32_and_rounded_once():
    """1 + 2^-8 + 2^-8 + init 0: in FP32 1 + 2^-7, which BF16 holds; a BF16 running sum
    would tie each 1 + 2^-8 back to 1."""
    x = np.array([[1.0, 2.0 ** -8, 2.0 ** -8]], ml_dtypes.bfloat16)
    init = np.zeros((1,), ml_dtypes.bfloat16)
    (out,) = run_kernel(reduce((0,), "add"), [x, init], [((), "bfloat16", set())], {"x": 1})
    assert float(out.item()) == 1 + 2.0 ** -7


def test_each_chip_reduces_its_own_rows_with_the_init_value():
    """max over dim 1 of each chip's [2, 3], with init 4: chip 0's rows peak at 2 and 9,
    chip 1's at 7 and -1; the init lifts what is below 4."""
    x = np.array([[[0, 2, 1], [9, 3, 3]], [[7, 7, -5], [-1, -2, -3]]], np.int32)
    init = np.array([4], np.int32)  # [x=1] + scalar: the same on every chip
    (out,) = run_kernel(reduce((1,), "maximum"), [x, init], [((2,), "int32", {0})],
                        {"x": 2})
    np.testing.assert_array_equal(out, [[4, 9], [7, 4]])


def test_add_of_bools_is_or():
    x = np.array([[[True, True], [False, False]]])
    init = np.array([False])
    (out,) = run_kernel(reduce((1,), "add"), [x, init], [((2,), "bool", set())], {"x": 1})
    np.testing.assert_array_equal(out, [[True, False]])


def lanes_then_tree(values):
    """The documented order of a float sum along one dim, in NumPy FP32: element k to lane
    k % L of L = max(8, the smallest power of two from K / 32) lanes, each lane summed in
    sequence, then lane i added to lane i + L/2 until one is left."""
    k = len(values)
    lanes = max(8, 1 << (-(-k // 32) - 1).bit_length())
    acc = np.full(lanes, -0.0, np.float32)
    for i, v in enumerate(values.astype(np.float32)):
        acc[i % lanes] = acc[i % lanes] + v
    while lanes > 1:
        lanes //= 2
        acc = acc[:lanes] + acc[lanes:2 * lanes]
    return acc[0]


@pytest.mark.parametrize("width", [7, 1000, 4096])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_float_sum_is_taken_in_lanes_then_a_tree(width, dtype):
    """Each of 3 chips' 5 rows of wide-ranging values summed along the row: the same bits
    as the documented order (XLA's own reduce, or a tree over all K, differ)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3, 5, width)) * 2.0 ** rng.integers(-20, 20, (3, 5, width)))
    x = x.astype(dtype)
    init = np.zeros((1,), np.float32)
    (out,) = run_kernel(reduce((1,), "add"), [x, init],
                        [((5,), "float32", {0})], {"x": 3})
    want = np.array([[lanes_then_tree(row) for row in chip] for chip in x], np.float32)
    np.testing.assert_array_equal(np.asarray(out).view(np.uint32), want.view(np.uint32))


def test_a_sum_over_two_dims_takes_the_lower_dim_first():
    """[40, 50] per chip summed over both dims: each column in lanes-then-tree order, then
    the 50 column sums the same way."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((2, 40, 50)) * 2.0 ** rng.integers(-20, 20, (2, 40, 50)))
    x = x.astype(np.float32)
    init = np.zeros((1,), np.float32)
    (out,) = run_kernel(reduce((0, 1), "add"), [x, init], [((), "float32", {0})], {"x": 2})
    want = np.array([lanes_then_tree(np.array([lanes_then_tree(col) for col in chip.T]))
                     for chip in x], np.float32)
    np.testing.assert_array_equal(np.asarray(out).reshape(-1).view(np.uint32),
                                  want.view(np.uint32))


def reduce_on(path_on_cpu, dims, combiner, x, out_dtype):
    """The reduce kernel on one chip's `x` over `dims`, init the identity, in the native
    kernel (`path_on_cpu`, as on CPU executor devices) or in XLA's slices (as elsewhere)."""
    kept = tuple(n for d, n in enumerate(x.shape[1:]) if d not in dims)
    init = np.full((1,), 1 if combiner == "multiply" else 0, x.dtype)
    instr, ctx = kernel_call(reduce(dims, combiner), [x, init], [(kept, out_dtype, set())],
                             {"x": 1})
    ctx = dataclasses.replace(ctx, on_cpu=path_on_cpu)
    with jax.enable_x64(True):
        return np.asarray(kernel_for(instr)(instr, [jnp.asarray(x), jnp.asarray(init)], ctx)[0])


@pytest.mark.parametrize("shape,dims", [((5,), (0,)), ((3, 7), (1,)), ((7, 3), (0,)),
                                        ((2, 1000), (1,)), ((1000, 70), (0,)),
                                        ((3, 300, 130), (1,)), ((5000, 2), (0,)),
                                        ((3, 5000), (1,)), ((40, 50), (0, 1)),
                                        ((4, 9, 33), (0, 2))])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
@pytest.mark.parametrize("combiner", ["add", "multiply"])
def test_the_native_kernel_takes_the_steps_of_the_xla_slices(shape, dims, dtype, combiner):
    """On CPU executor devices the native kernel combines the lanes, and XLA's slices
    elsewhere: the same bits, over a reduced dim of fewer elements than 8 lanes, of a
    last run part-full, of more than 128 lanes (5000), columns not a multiple of its
    64-wide strips, several dims; with -0, infinities and a NaN among wide-ranging values
    (a product's values near 1, so that it neither overflows nor underflows throughout).
    A NaN is a NaN in both, but which of two NaNs a sum gives depends on the order in
    which a compiler hands the add its operands (as in the native matmul)."""
    rng = np.random.default_rng(3)
    if combiner == "add":
        x = rng.standard_normal((1,) + shape) * 2.0 ** rng.integers(-20, 20, (1,) + shape)
    else:
        x = 1 + rng.standard_normal((1,) + shape) / 64
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, 4)] = [-0.0, np.inf, -np.inf, np.nan][:min(4, flat.size)]
    with np.errstate(over="ignore"):  # FP16: past its range, infinite
        x = x.astype(np.float32).astype(dtype)
    out_dtype = "float32" if dtype == np.float32 else np.dtype(dtype).name
    native_result = reduce_on(True, dims, combiner, x, out_dtype)
    xla_result = reduce_on(False, dims, combiner, x, out_dtype)
    nan = np.isnan(xla_result.astype(np.float32))
    np.testing.assert_array_equal(np.isnan(native_result.astype(np.float32)), nan)
    np.testing.assert_array_equal(bits(native_result)[~nan], bits(xla_result)[~nan])


def test_a_bf16_sum_makes_no_fp32_copy_of_its_operand():
    """A BF16 [1024, 1024] summed along each dim: the compiled kernel's temporaries take
    less than the operand's 2 MiB, where XLA:CPU's slices of it take a 4 MiB FP32 copy
    (which made such a sum 8-29 times slower than XLA's own reduce)."""
    x = np.ones((1, 1024, 1024), ml_dtypes.bfloat16)
    init = np.zeros((1,), ml_dtypes.bfloat16)
    for dim in (0, 1):
        instr, ctx = kernel_call(reduce((dim,), "add"), [x, init],
                                 [((1024,), "bfloat16", set())], {"x": 1})
        with jax.enable_x64(True):
            compiled = jax.jit(lambda x, init: kernel_for(instr)(instr, [x, init], ctx)[0]
                               ).lower(jnp.asarray(x), jnp.asarray(init)).compile()
        assert compiled.memory_analysis().temp_size_in_bytes < x.nbytes, dim


@pytest.mark.parametrize("path_on_cpu", [True, False])
def test_a_bf16_reduce_over_no_dims_combines_each_element_with_the_init(path_on_cpu):
    """A reduce over no dims (a pad's or a scalar sum's transpose) is each element combined
    with the init value: it does not reach the native kernel, which takes BF16 as it is
    and would leave it BF16 next to the FP32 init."""
    x = np.array([[1.5, 2.0, -0.0]], ml_dtypes.bfloat16)
    out = reduce_on(path_on_cpu, (), "add", x, "bfloat16")
    np.testing.assert_array_equal(bits(out), bits(np.array([[1.5, 2.0, 0.0]], ml_dtypes.bfloat16)))
