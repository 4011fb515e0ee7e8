"""The remaining StableHLO and CHLO ops: dynamic-shape ops whose shapes are known while
lowering, chlo.mulhi, chlo.scan, chlo.ragged_dot, stablehlo.composite and stablehlo.map.
Written as StableHLO where jax does not emit the op, run through the PJRT-style client and
compared with the StableHLO spec's own examples (its interpreter tests) and numpy renderings
of the spec; compared with CPU JAX where jax emits the op."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_trn2
from lowering import UnsupportedOpError


def run(text: str, *args) -> list[np.ndarray]:
    return [np.asarray(r) for r in jax_trn2.client().compile(text).execute(list(args))]


def module(arguments: str, results: str, body: str, functions: str = "") -> str:
    return (f"module @m {{\n{functions}\n  func.func public @main({arguments}) -> ({results}) "
            f"{{\n{body}\n  }}\n}}")


# --- dynamic shapes ------------------------------------------------------------------------

def test_dynamic_ops_with_constant_shapes_as_the_spec_examples():
    """The interpreter tests' dynamic_iota (a dynamic result type), dynamic_reshape,
    dynamic_broadcast_in_dim, dynamic_gather, dynamic_conv and get_dimension_size of a
    dynamically shaped value."""
    text = module("", "tensor<?x?xi64>, tensor<6xi64>, tensor<2x3x2xi64>, tensor<i32>, "
                  "tensor<2x3x2x2xi64>, tensor<1x2x2x1xi64>", """
    %output_shape = stablehlo.constant dense<[3, 4]> : tensor<2xi64>
    %0 = stablehlo.dynamic_iota %output_shape, dim = 0 : (tensor<2xi64>) -> tensor<?x?xi64>
    %c = stablehlo.constant dense<[[1, 2, 3, 4, 5, 6]]> : tensor<1x6xi64>
    %shape = stablehlo.constant dense<[6]> : tensor<1xi64>
    %1 = stablehlo.dynamic_reshape %c, %shape : (tensor<1x6xi64>, tensor<1xi64>) -> tensor<6xi64>
    %b = stablehlo.constant dense<[[1, 2, 3]]> : tensor<1x3xi64>
    %dims = stablehlo.constant dense<[2, 3, 2]> : tensor<3xi64>
    %2 = "stablehlo.dynamic_broadcast_in_dim"(%b, %dims) {
      broadcast_dimensions = array<i64: 2, 1>, known_expanding_dimensions = array<i64: 0>,
      known_non_expanding_dimensions = array<i64: 1>
    } : (tensor<1x3xi64>, tensor<3xi64>) -> tensor<2x3x2xi64>
    %3 = stablehlo.get_dimension_size %0, dim = 1 : (tensor<?x?xi64>) -> tensor<i32>
    %operand = stablehlo.constant dense<[[[1, 2], [3, 4], [5, 6], [7, 8]],
      [[9, 10], [11, 12], [13, 14], [15, 16]], [[17, 18], [19, 20], [21, 22], [23, 24]]]>
      : tensor<3x4x2xi64>
    %start = stablehlo.constant dense<[[[0, 0], [1, 0], [2, 1]], [[0, 1], [1, 1], [0, 9]]]>
      : tensor<2x3x2xi64>
    %sizes = stablehlo.constant dense<[1, 2, 2]> : tensor<3xi32>
    %4 = "stablehlo.dynamic_gather"(%operand, %start, %sizes) {
      dimension_numbers = #stablehlo.gather<offset_dims = [2, 3], collapsed_slice_dims = [0],
        start_index_map = [1, 0], index_vector_dim = 2>, indices_are_sorted = false
    } : (tensor<3x4x2xi64>, tensor<2x3x2xi64>, tensor<3xi32>) -> tensor<2x3x2x2xi64>
    %lhs = stablehlo.constant dense<[[[[1], [2], [5], [6]], [[3], [4], [7], [8]],
      [[10], [11], [14], [15]], [[12], [13], [16], [17]]]]> : tensor<1x4x4x1xi64>
    %rhs = stablehlo.constant dense<1> : tensor<3x3x1x1xi64>
    %padding = stablehlo.constant dense<0> : tensor<2x2xi64>
    %5 = "stablehlo.dynamic_conv"(%lhs, %rhs, %padding) {
      dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>,
      window_strides = array<i64: 4, 4>, lhs_dilation = array<i64: 2, 2>,
      batch_group_count = 1 : i64, feature_group_count = 1 : i64
    } : (tensor<1x4x4x1xi64>, tensor<3x3x1x1xi64>, tensor<2x2xi64>) -> tensor<1x2x2x1xi64>
    return %0, %1, %2, %3, %4, %5 : tensor<?x?xi64>, tensor<6xi64>, tensor<2x3x2xi64>,
      tensor<i32>, tensor<2x3x2x2xi64>, tensor<1x2x2x1xi64>""")
    iota, reshaped, broadcast, size, gathered, conv = run(text)
    np.testing.assert_array_equal(iota, np.repeat(np.arange(3)[:, None], 4, axis=1))
    np.testing.assert_array_equal(reshaped, [1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(broadcast, [[[1, 1], [2, 2], [3, 3]]] * 2)
    assert size == 4 and size.dtype == np.int32
    np.testing.assert_array_equal(gathered, [
        [[[1, 2], [3, 4]], [[3, 4], [5, 6]], [[13, 14], [15, 16]]],
        [[[9, 10], [11, 12]], [[11, 12], [13, 14]], [[17, 18], [19, 20]]]])
    np.testing.assert_array_equal(conv, [[[[10], [26]], [[46], [62]]]])


def test_dynamic_ops_with_shape_operands_from_arguments():
    """A static result type needs no known shape operand (dynamic_reshape, dynamic_iota,
    dynamic_gather's slice sizes come from it); dynamic_pad with constant and computed
    padding; padding from an argument is an error naming the operand."""
    text = module("%n: tensor<2xi64>, %x: tensor<6xf32>, %s: tensor<2xi64>",
                  "tensor<2x3xf32>, tensor<2x3xi64>, tensor<10xf32>, tensor<2x1x2xf32>", """
    %0 = stablehlo.dynamic_reshape %x, %n : (tensor<6xf32>, tensor<2xi64>) -> tensor<2x3xf32>
    %i = stablehlo.constant dense<[[2], [0]]> : tensor<2x1xi32>
    %g = "stablehlo.dynamic_gather"(%0, %i, %s) {
      dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], start_index_map = [1],
        index_vector_dim = 1>} : (tensor<2x3xf32>, tensor<2x1xi32>, tensor<2xi64>)
      -> tensor<2x1x2xf32>
    %1 = stablehlo.dynamic_iota %n, dim = 1 : (tensor<2xi64>) -> tensor<2x3xi64>
    %z = stablehlo.constant dense<-1.0> : tensor<f32>
    %one = stablehlo.constant dense<1> : tensor<1xi64>
    %two = stablehlo.add %one, %one : tensor<1xi64>
    %none = stablehlo.constant dense<0> : tensor<1xi64>
    %2 = stablehlo.dynamic_pad %x, %z, %one, %two, %none
      : (tensor<6xf32>, tensor<f32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<9xf32>
    %3 = stablehlo.dynamic_pad %2, %z, %none, %one, %none
      : (tensor<9xf32>, tensor<f32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<10xf32>
    return %0, %1, %3, %g : tensor<2x3xf32>, tensor<2x3xi64>, tensor<10xf32>,
      tensor<2x1x2xf32>""")
    x = np.arange(6, dtype=np.float32)
    # The gather's slice sizes (an argument) are [1, 2]: the first row's two columns from
    # the start column (2 clamped to 1, then 0).
    reshaped, iota, padded, gathered = run(text, np.array([2, 3]), x, np.array([1, 2]))
    np.testing.assert_array_equal(gathered, [x.reshape(2, 3)[:1, 1:], x.reshape(2, 3)[:1, :2]])
    np.testing.assert_array_equal(reshaped, x.reshape(2, 3))
    np.testing.assert_array_equal(iota, [[0, 1, 2]] * 2)
    np.testing.assert_array_equal(padded, np.pad(x, (1, 3), constant_values=-1))

    text = module("%p: tensor<1xi64>, %x: tensor<6xf32>", "tensor<8xf32>", """
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %0 = stablehlo.dynamic_pad %x, %z, %p, %p, %p
      : (tensor<6xf32>, tensor<f32>, tensor<1xi64>, tensor<1xi64>, tensor<1xi64>) -> tensor<8xf32>
    return %0 : tensor<8xf32>""")
    with pytest.raises(UnsupportedOpError, match=r"operand 2 \(edge_padding_low\) of "
                       r"stablehlo.dynamic_pad is not known while lowering"):
        jax_trn2.client().compile(text)


def test_dynamic_shape_from_an_argument_is_an_error_naming_the_operand():
    text = module("%n: tensor<1xi64>", "tensor<?xi64>", """
    %0 = stablehlo.dynamic_iota %n, dim = 0 : (tensor<1xi64>) -> tensor<?xi64>
    return %0 : tensor<?xi64>""")
    with pytest.raises(UnsupportedOpError, match=r"operand 0 \(output_shape\), which is not a "
                       r"constant.*stablehlo.dynamic_iota"):
        jax_trn2.client().compile(text)


# --- chlo.mulhi ----------------------------------------------------------------------------

MULHI_TYPES = {"i8": np.int8, "ui8": np.uint8, "i16": np.int16, "ui16": np.uint16,
               "i32": np.int32, "ui32": np.uint32, "i64": np.int64, "ui64": np.uint64}


@pytest.mark.parametrize("spelling", MULHI_TYPES)
def test_mulhi_is_the_high_half_of_the_full_product(spelling):
    """The type's extremes and random operands, against the high half of Python's exact
    integer product."""
    dtype = np.dtype(MULHI_TYPES[spelling])
    info = np.iinfo(dtype)
    bits = 8 * dtype.itemsize
    rng = np.random.default_rng(bits)
    extremes = np.array([info.min, info.min + 1, -1 if info.min else 1, 0, 1, info.max - 1,
                         info.max], dtype)
    x = np.concatenate([np.repeat(extremes, extremes.size),
                        rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)])
    y = np.concatenate([np.tile(extremes, extremes.size),
                        rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)])
    t = f"tensor<{x.size}x{spelling}>"
    text = module(f"%x: {t}, %y: {t}", t, f"""
    %0 = "chlo.mulhi"(%x, %y) : ({t}, {t}) -> {t}
    return %0 : {t}""")
    (got,) = run(text, x, y)
    want = np.array([(int(a) * int(b)) >> bits for a, b in zip(x, y)], dtype=object)
    np.testing.assert_array_equal(got.astype(object), want)
    assert got.dtype == dtype


def test_mulhi_spec_examples():
    """The interpreter's chlo/mulhi tests for 8- and 64-bit operands."""
    text = module("", "tensor<3xi8>, tensor<2xui8>, tensor<2xi64>, tensor<2xui64>", """
    %a = stablehlo.constant dense<[64, -64, -64]> : tensor<3xi8>
    %b = stablehlo.constant dense<[4, 4, -4]> : tensor<3xi8>
    %0 = "chlo.mulhi"(%a, %b) : (tensor<3xi8>, tensor<3xi8>) -> tensor<3xi8>
    %c = stablehlo.constant dense<[240, 128]> : tensor<2xui8>
    %d = stablehlo.constant dense<[16, 2]> : tensor<2xui8>
    %1 = "chlo.mulhi"(%c, %d) : (tensor<2xui8>, tensor<2xui8>) -> tensor<2xui8>
    %e = stablehlo.constant dense<[1152921504606846976, -1152921504606846976]> : tensor<2xi64>
    %f = stablehlo.constant dense<[16, 16]> : tensor<2xi64>
    %2 = "chlo.mulhi"(%e, %f) : (tensor<2xi64>, tensor<2xi64>) -> tensor<2xi64>
    %g = stablehlo.constant dense<[17293822569102704640, 9223372036854775808]> : tensor<2xui64>
    %h = stablehlo.constant dense<[16, 2]> : tensor<2xui64>
    %3 = "chlo.mulhi"(%g, %h) : (tensor<2xui64>, tensor<2xui64>) -> tensor<2xui64>
    return %0, %1, %2, %3 : tensor<3xi8>, tensor<2xui8>, tensor<2xi64>, tensor<2xui64>""")
    i8, u8, i64, u64 = run(text)
    np.testing.assert_array_equal(i8, [1, -1, 1])
    np.testing.assert_array_equal(u8, [15, 1])
    np.testing.assert_array_equal(i64, [1, -1])
    np.testing.assert_array_equal(u64, [15, 1])


# --- stablehlo.composite -------------------------------------------------------------------

def test_composite_spec_example_runs_its_decomposition_listed_under_its_name():
    text = module("", "tensor<i64>", """
    %0 = stablehlo.constant dense<1> : tensor<i64>
    %1 = stablehlo.composite "stablehlo.add_n" %0 {
      composite_attributes = {n = 2 : i64}, decomposition = @add_n.impl
    } : (tensor<i64>) -> tensor<i64>
    return %1 : tensor<i64>""", functions="""
  func.func private @add_n.impl(%arg0: tensor<i64>) -> tensor<i64> {
    %0 = stablehlo.constant dense<2> : tensor<i64>
    %1 = stablehlo.add %arg0, %0 : tensor<i64>
    func.return %1 : tensor<i64>
  }""")
    executable = jax_trn2.client().compile(text)
    (result,) = executable.execute([])
    assert int(result) == 3
    listing = executable.as_text()
    assert "Composite(" in listing and "name=stablehlo.add_n" in listing
    assert "stablehlo.add_n = @add_n.impl(" in listing  # the decomposition, indented under it
    assert "Vector.add(" in listing


def test_jax_composite_in_a_shard_map_body_matches_cpu_jax(rng):
    """lax.composite (jax emits stablehlo.composite) around a softplus, inside a shard_map
    body whose operands differ from chip to chip, with a collective after it."""
    from functools import partial

    from e2e_reference import assert_matches, run_both
    from jax.sharding import PartitionSpec as P

    @partial(jax.lax.composite, name="my.softplus")
    def softplus(x, *, beta):
        return jnp.log1p(jnp.exp(beta * x)) / beta

    def body(x):
        return jax.lax.psum(softplus(x, beta=2.0), "x")

    x = rng.standard_normal((8, 16)).astype(np.float32)
    got, want = run_both(body, (4, 4, 4), ("x", "y", "z"), (P("x", "y"),), P(None, "y"), x)
    assert_matches(got, want)


# --- stablehlo.map -------------------------------------------------------------------------

def test_map_applies_its_computation_to_each_element():
    """Two operands of different types, a computation of several ops (with a conversion
    and a select), as the spec's map example generalised; and a map of rank 0."""
    x = np.array([[0.5, -1.0, 2.0], [3.0, -4.5, 0.0]], np.float32)
    k = np.array([[1, 2, 3], [-4, 5, 6]], np.int32)
    text = module("%x: tensor<2x3xf32>, %k: tensor<2x3xi32>, %s: tensor<f32>",
                  "tensor<2x3xf32>, tensor<f32>", """
    %0 = "stablehlo.map"(%x, %k) ({
      ^bb0(%a: tensor<f32>, %b: tensor<i32>):
        %f = stablehlo.convert %b : (tensor<i32>) -> tensor<f32>
        %p = stablehlo.multiply %a, %f : tensor<f32>
        %z = stablehlo.constant dense<0.0> : tensor<f32>
        %n = stablehlo.compare LT, %p, %z : (tensor<f32>, tensor<f32>) -> tensor<i1>
        %q = stablehlo.negate %p : tensor<f32>
        %r = stablehlo.select %n, %q, %p : tensor<i1>, tensor<f32>
        stablehlo.return %r : tensor<f32>
    }) {dimensions = array<i64: 0, 1>} : (tensor<2x3xf32>, tensor<2x3xi32>) -> tensor<2x3xf32>
    %1 = "stablehlo.map"(%s, %s) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %p = stablehlo.add %a, %b : tensor<f32>
        stablehlo.return %p : tensor<f32>
    }) {dimensions = array<i64>} : (tensor<f32>, tensor<f32>) -> tensor<f32>
    return %0, %1 : tensor<2x3xf32>, tensor<f32>""")
    mapped, doubled = run(text, x, k, np.float32(1.25))
    np.testing.assert_array_equal(mapped, np.abs(x * k))
    assert doubled == 2.5


# --- chlo.scan -----------------------------------------------------------------------------

SCAN_SUM = """^bb0(%e: tensor<{t}>, %c: tensor<{t}>):
      %s = stablehlo.add %e, %c : tensor<{t}>
      stablehlo.return %s, %s : tensor<{t}>, tensor<{t}>"""


def test_scan_spec_examples():
    """The interpreter's chlo/scan tests: cumulative sums along dims 0 and 1, forward and
    reverse, and cummax with argmax (two inputs, two carries, ties keep the higher index)."""
    text = module("", "tensor<4xi32>, tensor<i32>, tensor<2x3xi32>, tensor<2xi32>, "
                  "tensor<4xi32>, tensor<i32>, tensor<5xi32>, tensor<5xi32>, tensor<i32>, "
                  "tensor<i32>", f"""
    %input = stablehlo.constant dense<[1, 2, 3, 4]> : tensor<4xi32>
    %init = stablehlo.constant dense<0> : tensor<i32>
    %0:2 = chlo.scan(%input) inits(%init) dimension=0 {{
    {SCAN_SUM.format(t="i32")}
    }} : (tensor<4xi32>, tensor<i32>) -> (tensor<4xi32>, tensor<i32>)
    %matrix = stablehlo.constant dense<[[1, 2, 3], [4, 5, 6]]> : tensor<2x3xi32>
    %inits = stablehlo.constant dense<0> : tensor<2xi32>
    %1:2 = chlo.scan(%matrix) inits(%inits) dimension=1 {{
    {SCAN_SUM.format(t="2xi32")}
    }} : (tensor<2x3xi32>, tensor<2xi32>) -> (tensor<2x3xi32>, tensor<2xi32>)
    %2:2 = chlo.scan(%input) inits(%init) dimension=0 attributes {{is_reverse = true}} {{
    {SCAN_SUM.format(t="i32")}
    }} : (tensor<4xi32>, tensor<i32>) -> (tensor<4xi32>, tensor<i32>)
    %values = stablehlo.constant dense<[3, 1, 4, 1, 5]> : tensor<5xi32>
    %iota = stablehlo.constant dense<[0, 1, 2, 3, 4]> : tensor<5xi32>
    %lowest = stablehlo.constant dense<-2147483648> : tensor<i32>
    %3:4 = chlo.scan(%values, %iota) inits(%lowest, %init) dimension=0 {{
    ^bb0(%v: tensor<i32>, %i: tensor<i32>, %best: tensor<i32>, %at: tensor<i32>):
      %m = stablehlo.maximum %best, %v : tensor<i32>
      %gt = stablehlo.compare GT, %best, %v : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %eq = stablehlo.compare EQ, %best, %v : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %later = stablehlo.maximum %at, %i : tensor<i32>
      %tie = stablehlo.select %eq, %later, %i : tensor<i1>, tensor<i32>
      %where = stablehlo.select %gt, %at, %tie : tensor<i1>, tensor<i32>
      stablehlo.return %m, %where, %m, %where : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>
    }} : (tensor<5xi32>, tensor<5xi32>, tensor<i32>, tensor<i32>)
      -> (tensor<5xi32>, tensor<5xi32>, tensor<i32>, tensor<i32>)
    return %0#0, %0#1, %1#0, %1#1, %2#0, %2#1, %3#0, %3#1, %3#2, %3#3
      : tensor<4xi32>, tensor<i32>, tensor<2x3xi32>, tensor<2xi32>, tensor<4xi32>, tensor<i32>,
        tensor<5xi32>, tensor<5xi32>, tensor<i32>, tensor<i32>""")
    results = [r.tolist() for r in run(text)]
    assert results == [[1, 3, 6, 10], 10, [[1, 3, 6], [4, 9, 15]], [6, 15], [10, 9, 7, 4], 10,
                       [3, 3, 4, 4, 5], [0, 0, 2, 2, 4], 5, 4]


def test_scan_with_outputs_unlike_its_inputs_is_costed_per_step():
    """A body whose output has another type than its input (a weighted running sum as f32
    from i32, the weights a constant of the body: chlo.scan is isolated from above); the
    estimate counts the body once per position along the scanned dimension."""
    text = module("%x: tensor<3x5xi32>", "tensor<3x5xf32>, tensor<3xi32>", """
    %zero = stablehlo.constant dense<0> : tensor<3xi32>
    %0:2 = chlo.scan(%x) inits(%zero) dimension=1 {
    ^bb0(%e: tensor<3xi32>, %c: tensor<3xi32>):
      %w = stablehlo.constant dense<[0.5, 1.0, -2.0]> : tensor<3xf32>
      %s = stablehlo.add %e, %c : tensor<3xi32>
      %f = stablehlo.convert %s : (tensor<3xi32>) -> tensor<3xf32>
      %o = stablehlo.multiply %f, %w : tensor<3xf32>
      stablehlo.return %o, %s : tensor<3xf32>, tensor<3xi32>
    } : (tensor<3x5xi32>, tensor<3xi32>) -> (tensor<3x5xf32>, tensor<3xi32>)
    return %0#0, %0#1 : tensor<3x5xf32>, tensor<3xi32>""")
    x = np.arange(15, dtype=np.int32).reshape(3, 5)
    w = np.array([0.5, 1.0, -2.0], np.float32)
    executable = jax_trn2.client().compile(text)
    scaled, total = (np.asarray(r) for r in executable.execute([x]))
    np.testing.assert_array_equal(scaled, np.cumsum(x, axis=1) * w[:, None])
    np.testing.assert_array_equal(total, x.sum(axis=1))
    # add, convert and multiply on 3 elements, at each of 5 positions.
    assert executable.cost_analysis()["flops"] == 5 * 3 * 3


# --- chlo.ragged_dot -----------------------------------------------------------------------

def ragged_dot_module(f, *args) -> str:
    """The StableHLO jax emits for `f` when lowering for TPU: chlo.ragged_dot (on CPU jax
    decomposes ragged_dot into a dense dot_general over every group instead)."""
    return jax.jit(f).trace(*args).lower(lowering_platforms=("tpu",)).as_text()


RAGGED_FORMS = {  # name: (lhs shape, rhs shape, group sizes, RaggedDotDimensionNumbers args)
    "experts": ((10, 4), (3, 4, 5), [2, 5, 1], ((([1], [1]), ([], [])), [0], [0])),
    "experts_batched_sizes": ((2, 7, 3, 4), (2, 3, 4, 5), [[2, 1, 3], [0, 7, 0]],
                              ((([3], [2]), ([0], [0])), [1], [1])),
    "experts_group_dim_inside": ((3, 2, 7, 4), (3, 4, 3, 5), [2, 1, 3],
                                 ((([3], [1]), ([0], [0])), [2], [2])),
    "contraction": ((6, 10), (10, 5), [2, 5, 1], ((([1], [0]), ([], [])), [1], [])),
    "contraction_batched": ((2, 6, 10), (2, 10, 5), [[2, 5, 1], [10, 0, 0]],
                            ((([2], [1]), ([0], [0])), [2], [])),
    "batch": ((6, 3, 4), (6, 4, 5), [2, 1], ((([2], [1]), ([0], [0])), [0], [])),
}


@pytest.mark.parametrize("form", RAGGED_FORMS)
def test_ragged_dot_matches_cpu_jax(form, rng):
    """Every form of ragged_dot_general: a ragged free dim with the rhs group dim anywhere
    (rows after the last group are zeros), group sizes per batch element, a ragged
    contraction dim (a result per group), a ragged batch dim."""
    lhs_shape, rhs_shape, sizes, dims = RAGGED_FORMS[form]
    numbers = jax.lax.RaggedDotDimensionNumbers(*dims)

    def f(lhs, rhs, group_sizes):
        return jax.lax.ragged_dot_general(lhs, rhs, group_sizes, numbers)

    lhs = rng.standard_normal(lhs_shape).astype(np.float32)
    rhs = rng.standard_normal(rhs_shape).astype(np.float32)
    sizes = np.array(sizes, np.int32)
    (got,) = run(ragged_dot_module(f, lhs, rhs, sizes), lhs, rhs, sizes)
    want = np.asarray(jax.jit(f)(lhs, rhs, sizes))
    assert got.shape == want.shape
    # FP32 products are rounded to FP32 on the Tensor Engine (mesh.numerics) and summed in
    # another order than CPU JAX's: |error| <= (K + 1) * 2**-24 * sum|a_k b_k|, K <= 10.
    bound = 11 * 2.0 ** -24 * np.abs(lhs).max() * np.abs(rhs).max() * 10
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)


def test_bf16_experts_are_exact_per_group_and_costed_per_group(rng):
    """BF16 mixture of experts (m = 240 tokens over 3 experts of k = 300, n = 64): BF16
    products are exact and each group's sum is FP32 over passes of 128; the estimate is 3
    matmuls of 80 rows (group sizes are runtime values: equal groups are assumed), not a
    dense dot over every expert."""
    lhs = rng.standard_normal((240, 300)).astype(jnp.bfloat16)
    rhs = rng.standard_normal((3, 300, 64)).astype(jnp.bfloat16)
    sizes = np.array([50, 150, 40], np.int32)
    executable = jax_trn2.client().compile(ragged_dot_module(jax.lax.ragged_dot, lhs, rhs, sizes))
    (got,) = executable.execute([lhs, rhs, sizes])
    want = jax.jit(jax.lax.ragged_dot)(lhs, rhs, sizes)
    # Each output rounds an FP32 sum of exact products to BF16: sums in another order
    # differ in their last FP32 bits, so results may be one BF16 ulp apart.
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=2.0 ** -7, atol=0)
    assert executable.cost_analysis()["flops"] == 2 * 3 * 80 * 64 * 300
    assert "Tensor.RaggedMatmul(" in executable.as_text()


def test_gradient_of_a_mixture_of_experts_layer(rng):
    """jax.grad of a ragged_dot layer: the backward pass is two more ragged_dots (the rhs
    gradient a ragged contraction, the lhs gradient against the transposed experts)."""
    lhs = rng.standard_normal((12, 8)).astype(np.float32)
    rhs = rng.standard_normal((3, 8, 5)).astype(np.float32)
    sizes = np.array([3, 6, 2], np.int32)  # the last row is in no group

    def loss(lhs, rhs, group_sizes):
        return jnp.sum(jnp.tanh(jax.lax.ragged_dot(lhs, rhs, group_sizes)))

    grad = jax.grad(loss, argnums=(0, 1))
    text = ragged_dot_module(grad, lhs, rhs, sizes)
    assert text.count('"chlo.ragged_dot"') == 3
    got = run(text, lhs, rhs, sizes)
    want = jax.jit(grad)(lhs, rhs, sizes)
    # FP32 rounding of products and sums in another order, over contractions of <= 12
    # terms of magnitude <= max|lhs| * max|rhs|, through tanh' <= 1.
    bound = 13 * 2.0 ** -24 * 12 * np.abs(lhs).max() * np.abs(rhs).max()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, np.asarray(w), rtol=0, atol=bound)


# --- batch norm ----------------------------------------------------------------------------

def _batch_norm_reference(x, scale, offset, mean, variance, grad, epsilon, feature):
    """numpy, in float64, of the spec's definitions (feature dimension `feature`)."""
    others = tuple(d for d in range(x.ndim) if d != feature)
    along = lambda v: np.expand_dims(v, others)  # noqa: E731  (per feature, broadcast)
    batch_mean, batch_var = x.mean(others), x.var(others)
    stddev = np.sqrt(along(variance) + epsilon)
    normalized = (x - along(mean)) / stddev
    inference = along(scale) * normalized + along(offset)
    training = along(scale) * (x - along(batch_mean)) / np.sqrt(along(batch_var) + epsilon) \
        + along(offset)
    n = x.size / x.shape[feature]
    centered = x - along(mean)
    i6 = grad * n - along(grad.sum(others)) - along((grad * centered).sum(others)) * centered \
        / (along(variance) + epsilon)
    grad_operand = along(scale) / stddev / n * i6
    return (inference, (training, batch_mean, batch_var),
            (grad_operand, (grad * normalized).sum(others), grad.sum(others)))


def test_batch_norm_ops_compute_the_spec_expansions(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32) * 2 + 1
    scale, offset, mean = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    variance = rng.uniform(0.5, 2, 3).astype(np.float32)
    grad = rng.standard_normal((2, 3, 4)).astype(np.float32)
    t, v = "tensor<2x3x4xf32>", "tensor<3xf32>"
    attrs = "epsilon = 1.0e-03 : f32, feature_index = 1 : i64"
    text = module(f"%x: {t}, %s: {v}, %o: {v}, %m: {v}, %var: {v}, %g: {t}",
                  f"{t}, {t}, {v}, {v}, {t}, {v}, {v}", f"""
    %i = "stablehlo.batch_norm_inference"(%x, %s, %o, %m, %var) {{{attrs}}}
      : ({t}, {v}, {v}, {v}, {v}) -> {t}
    %tr:3 = "stablehlo.batch_norm_training"(%x, %s, %o) {{{attrs}}}
      : ({t}, {v}, {v}) -> ({t}, {v}, {v})
    %gr:3 = "stablehlo.batch_norm_grad"(%x, %s, %m, %var, %g) {{{attrs}}}
      : ({t}, {v}, {v}, {v}, {t}) -> ({t}, {v}, {v})
    return %i, %tr#0, %tr#1, %tr#2, %gr#0, %gr#1, %gr#2 : {t}, {t}, {v}, {v}, {t}, {v}, {v}""")
    got = run(text, x, scale, offset, mean, variance, grad)
    inference, training, grads = _batch_norm_reference(
        *(a.astype(np.float64) for a in (x, scale, offset, mean, variance, grad)), 1e-3, 1)
    for g, want in zip(got, (inference, *training, *grads), strict=True):
        assert g.dtype == np.float32 and g.shape == want.shape
        # FP32 roundings of sums over 8 elements of magnitude ~5: well under 1e-5 relative
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)
