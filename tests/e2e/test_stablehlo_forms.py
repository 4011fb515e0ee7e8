"""Forms of gather, scatter, sort, convolution and select_and_scatter that the StableHLO spec
allows but jax does not emit (index vectors in a leading dim or implicit, several scatter
operands with an update computation, comparators other than lax.sort's, window reversal,
a scatter computation that is not a combiner), written as StableHLO, run through the
PJRT-style client and compared exactly with numpy renderings of the spec."""

from __future__ import annotations

import numpy as np

import jax_trn2


def run(text: str, *args: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(r) for r in jax_trn2.client().compile(text).execute(list(args))]


def module(arguments: str, results: str, body: str) -> str:
    return (f"module @m {{\n  func.func public @main({arguments}) -> ({results}) {{\n{body}"
            "\n  }\n}")


def test_gather_index_vector_in_leading_dim_and_implicit():
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    leading = np.array([[4, 9, -2]], np.int32)  # the index vector is dim 0 (length 1)
    implicit = np.array([1, 3, 0], np.int32)  # index_vector_dim = rank: scalar indices
    text = module("%x: tensor<5x4xf32>, %i: tensor<1x3xi32>, %j: tensor<3xi32>",
                  "tensor<3x4xf32>, tensor<3x2xf32>", """
    %0 = "stablehlo.gather"(%x, %i) {dimension_numbers = #stablehlo.gather<offset_dims = [1],
      collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 0>,
      slice_sizes = array<i64: 1, 4>} : (tensor<5x4xf32>, tensor<1x3xi32>) -> tensor<3x4xf32>
    %1 = "stablehlo.gather"(%x, %j) {dimension_numbers = #stablehlo.gather<offset_dims = [1],
      collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>,
      slice_sizes = array<i64: 1, 2>} : (tensor<5x4xf32>, tensor<3xi32>) -> tensor<3x2xf32>
    return %0, %1 : tensor<3x4xf32>, tensor<3x2xf32>""")
    rows, pairs = run(text, x, leading, implicit)
    np.testing.assert_array_equal(rows, x[np.clip(leading[0], 0, 4)])  # starts are clamped
    np.testing.assert_array_equal(pairs, x[implicit, :2])


def test_scatter_two_operands_with_update_computation():
    """Two operands, one update computation (add to the first, keep the larger of the
    second), a leading index vector dim, repeated and out-of-range indices."""
    a = np.arange(5, dtype=np.float32)
    b = np.array([3, -1, 4, -1, 5], np.int32)
    indices = np.array([[1, 3, 1, 7, -1]], np.int32)
    ua = np.array([10, 20, 30, 40, 50], np.float32)
    ub = np.array([-5, 9, 2, 8, 7], np.int32)
    text = module("%a: tensor<5xf32>, %b: tensor<5xi32>, %i: tensor<1x5xi32>, "
                  "%ua: tensor<5xf32>, %ub: tensor<5xi32>", "tensor<5xf32>, tensor<5xi32>", """
    %0:2 = "stablehlo.scatter"(%a, %b, %i, %ua, %ub) ({
    ^bb0(%oa: tensor<f32>, %ob: tensor<i32>, %na: tensor<f32>, %nb: tensor<i32>):
      %s = stablehlo.add %oa, %na : tensor<f32>
      %m = stablehlo.maximum %ob, %nb : tensor<i32>
      stablehlo.return %s, %m : tensor<f32>, tensor<i32>
    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0],
      scatter_dims_to_operand_dims = [0], index_vector_dim = 0>}
      : (tensor<5xf32>, tensor<5xi32>, tensor<1x5xi32>, tensor<5xf32>, tensor<5xi32>)
      -> (tensor<5xf32>, tensor<5xi32>)
    return %0#0, %0#1 : tensor<5xf32>, tensor<5xi32>""")
    want_a, want_b = a.copy(), b.copy()
    for k, i in enumerate(indices[0]):
        if 0 <= i < 5:  # windows outside the operand are skipped
            want_a[i] += ua[k]
            want_b[i] = max(want_b[i], ub[k])
    got_a, got_b = run(text, a, b, indices, ua, ub)
    np.testing.assert_array_equal(got_a, want_a)
    np.testing.assert_array_equal(got_b, want_b)


def test_sort_with_descending_comparator():
    """A stable sort by `lhs > rhs` on the first operand (not lax.sort's comparator), with
    a payload: ties keep their order."""
    keys = np.array([[3, 1, 3, 2, 1, 3], [0, 0, -4, 7, 7, 0]], np.int32)
    payload = np.arange(12, dtype=np.float32).reshape(2, 6)
    text = module("%k: tensor<2x6xi32>, %p: tensor<2x6xf32>",
                  "tensor<2x6xi32>, tensor<2x6xf32>", """
    %0:2 = "stablehlo.sort"(%k, %p) ({
    ^bb0(%a: tensor<i32>, %b: tensor<i32>, %c: tensor<f32>, %d: tensor<f32>):
      %gt = stablehlo.compare GT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %gt : tensor<i1>
    }) {dimension = 1 : i64, is_stable = true}
      : (tensor<2x6xi32>, tensor<2x6xf32>) -> (tensor<2x6xi32>, tensor<2x6xf32>)
    return %0#0, %0#1 : tensor<2x6xi32>, tensor<2x6xf32>""")
    order = np.argsort(-keys, axis=1, kind="stable")
    got_keys, got_payload = run(text, keys, payload)
    np.testing.assert_array_equal(got_keys, np.take_along_axis(keys, order, 1))
    np.testing.assert_array_equal(got_payload, np.take_along_axis(payload, order, 1))


def test_convolution_with_window_reversal():
    lhs = np.array([[[1, 2, 3, 4, 5]]], np.float32)
    rhs = np.array([[[1, 10, 100]]], np.float32)
    text = module("%l: tensor<1x1x5xf32>, %r: tensor<1x1x3xf32>", "tensor<1x1x5xf32>", """
    %0 = "stablehlo.convolution"(%l, %r) {batch_group_count = 1 : i64,
      dimension_numbers = #stablehlo.conv<[b, f, 0]x[o, i, 0]->[b, f, 0]>,
      feature_group_count = 1 : i64, padding = dense<[[1, 1]]> : tensor<1x2xi64>,
      window_reversal = array<i1: true>}
      : (tensor<1x1x5xf32>, tensor<1x1x3xf32>) -> tensor<1x1x5xf32>
    return %0 : tensor<1x1x5xf32>""")
    padded = np.pad(lhs[0, 0], 1)
    flipped = rhs[0, 0, ::-1]
    want = np.array([padded[k:k + 3] @ flipped for k in range(5)], np.float32)
    (got,) = run(text, lhs, rhs)
    np.testing.assert_array_equal(got[0, 0], want)


def test_select_and_scatter_with_other_computations():
    """select = `a < b` keeps a strictly smaller element (so the last minimum wins on
    ties), scatter = xor (not a combiner lax scatters with), overlapping padded windows."""
    operand = np.array([3, 1, 1, 4, 0, 0, 2], np.int32)
    source = np.array([5, 6, 7, 12], np.int32)  # windows of 3 at stride 2, padding (1, 1)
    text = module("%o: tensor<7xi32>, %s: tensor<4xi32>, %init: tensor<i32>",
                  "tensor<7xi32>", """
    %0 = "stablehlo.select_and_scatter"(%o, %s, %init) ({
    ^bb0(%a: tensor<i32>, %b: tensor<i32>):
      %lt = stablehlo.compare LT, %a, %b, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    }, {
    ^bb0(%a: tensor<i32>, %b: tensor<i32>):
      %x = stablehlo.xor %a, %b : tensor<i32>
      stablehlo.return %x : tensor<i32>
    }) {window_dimensions = array<i64: 3>, window_strides = array<i64: 2>,
        padding = dense<[[1, 1]]> : tensor<1x2xi64>}
      : (tensor<7xi32>, tensor<4xi32>, tensor<i32>) -> tensor<7xi32>
    return %0 : tensor<7xi32>""")
    want = np.full(7, 9, np.int32)
    for w, value in enumerate(source):
        inside = [p for p in range(2 * w - 1, 2 * w + 2) if 0 <= p < 7]
        chosen = inside[0]
        for p in inside[1:]:
            if not operand[chosen] < operand[p]:
                chosen = p
        want[chosen] ^= value
    (got,) = run(text, operand, source, np.array(9, np.int32))
    np.testing.assert_array_equal(got, want)


def test_boolean_add_in_reduce_window_and_scatter_is_or():
    """On i1, StableHLO's add is logical or: as a reduce_window reducer and as a scatter
    combiner."""
    x = np.array([False, True, False, False, True, True])
    indices = np.array([[0], [0], [3]], np.int32)
    updates = np.array([True, False, True])
    text = module("%x: tensor<6xi1>, %i: tensor<3x1xi32>, %u: tensor<3xi1>",
                  "tensor<5xi1>, tensor<6xi1>", """
    %f = stablehlo.constant dense<false> : tensor<i1>
    %0 = "stablehlo.reduce_window"(%x, %f) ({
    ^bb0(%a: tensor<i1>, %b: tensor<i1>):
      %s = stablehlo.add %a, %b : tensor<i1>
      stablehlo.return %s : tensor<i1>
    }) {window_dimensions = array<i64: 2>} : (tensor<6xi1>, tensor<i1>) -> tensor<5xi1>
    %1 = "stablehlo.scatter"(%x, %i, %u) ({
    ^bb0(%old: tensor<i1>, %new: tensor<i1>):
      %s = stablehlo.add %old, %new : tensor<i1>
      stablehlo.return %s : tensor<i1>
    }) {scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0],
      scatter_dims_to_operand_dims = [0], index_vector_dim = 1>}
      : (tensor<6xi1>, tensor<3x1xi32>, tensor<3xi1>) -> tensor<6xi1>
    return %0, %1 : tensor<5xi1>, tensor<6xi1>""")
    windows, scattered = run(text, x, indices, updates)
    np.testing.assert_array_equal(windows, x[:-1] | x[1:])
    want = x.copy()
    want[0] |= True
    want[3] |= True
    np.testing.assert_array_equal(scattered, want)
