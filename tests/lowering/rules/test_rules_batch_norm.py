"""lowering/rules/batch_norm.py: batch_norm_* expanded into the ops the StableHLO spec
defines them by; the expected values are the spec's formulas worked out by hand."""

import numpy as np

from mesh import isa
from rule_lowering import lower_text, run


def f32(*values):
    return np.array(values, np.float32)


def test_training_normalizes_each_feature_by_its_batch_mean_and_variance():
    program = lower_text("""func.func public @main(%x: tensor<2x2xf32>, %s: tensor<2xf32>,
        %o: tensor<2xf32>) -> (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>) {
      %y, %m, %v = "stablehlo.batch_norm_training"(%x, %s, %o)
          {epsilon = 0.0 : f32, feature_index = 1 : i64}
          : (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>)
          -> (tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>)
      return %y, %m, %v : tensor<2x2xf32>, tensor<2xf32>, tensor<2xf32>
    }""")
    # feature 0 holds 1, 3: mean 2, variance 1; feature 1 holds 10, 30: mean 20, variance 100
    y, mean, variance = run(program, np.array([[1, 10], [3, 30]], np.float32), f32(1, 2),
                            f32(0, 5))
    np.testing.assert_array_equal(mean, f32(2, 20))
    np.testing.assert_array_equal(variance, f32(1, 100))
    # (x - mean) / stddev is -1, 1 in both features; then * scale + offset
    np.testing.assert_array_equal(y, np.array([[-1, 3], [1, 7]], np.float32))


def test_training_sums_over_every_dimension_but_the_feature_one():
    program = lower_text("""func.func public @main(%x: tensor<2x3x4xf32>, %s: tensor<3xf32>,
        %o: tensor<3xf32>) -> (tensor<2x3x4xf32>, tensor<3xf32>, tensor<3xf32>) {
      %y, %m, %v = "stablehlo.batch_norm_training"(%x, %s, %o)
          {epsilon = 0.5 : f32, feature_index = 1 : i64}
          : (tensor<2x3x4xf32>, tensor<3xf32>, tensor<3xf32>)
          -> (tensor<2x3x4xf32>, tensor<3xf32>, tensor<3xf32>)
      return %y, %m, %v : tensor<2x3x4xf32>, tensor<3xf32>, tensor<3xf32>
    }""")
    sums = [i for i in program.instructions if isinstance(i, isa.Reduce)]
    assert [(s.dimensions, s.combiner) for s in sums] == [((0, 2), "add")] * 2  # mean, variance
    constants = sorted(float(i.value) for i in program.instructions
                       if isinstance(i, isa.Constant))
    # each sum's init 0, epsilon, and the 2 * 4 elements per feature dividing each sum
    assert constants == [0, 0, 0.5, 8, 8]


def test_inference_uses_the_given_mean_variance_and_epsilon():
    program = lower_text("""func.func public @main(%x: tensor<2x1xf32>, %s: tensor<1xf32>,
        %o: tensor<1xf32>, %m: tensor<1xf32>, %v: tensor<1xf32>) -> tensor<2x1xf32> {
      %y = "stablehlo.batch_norm_inference"(%x, %s, %o, %m, %v)
          {epsilon = 1.0 : f32, feature_index = 1 : i64}
          : (tensor<2x1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>)
          -> tensor<2x1xf32>
      return %y : tensor<2x1xf32>
    }""")
    # stddev = sqrt(3 + 1) = 2; (5 - 1) / 2 = 2 and (-3 - 1) / 2 = -2; then * 3 + 1
    (y,) = run(program, np.array([[5], [-3]], np.float32), f32(3), f32(1), f32(1), f32(3))
    np.testing.assert_array_equal(y, np.array([[7], [-5]], np.float32))


def test_grad_follows_the_spec_expansion():
    program = lower_text("""func.func public @main(%x: tensor<2x1xf32>, %s: tensor<1xf32>,
        %m: tensor<1xf32>, %v: tensor<1xf32>, %g: tensor<2x1xf32>)
        -> (tensor<2x1xf32>, tensor<1xf32>, tensor<1xf32>) {
      %gx, %gs, %go = "stablehlo.batch_norm_grad"(%x, %s, %m, %v, %g)
          {epsilon = 1.0 : f32, feature_index = 1 : i64}
          : (tensor<2x1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<1xf32>, tensor<2x1xf32>)
          -> (tensor<2x1xf32>, tensor<1xf32>, tensor<1xf32>)
      return %gx, %gs, %go : tensor<2x1xf32>, tensor<1xf32>, tensor<1xf32>
    }""")
    x, ones = np.array([[1], [2]], np.float32), np.ones((2, 1), np.float32)
    grad_x, grad_scale, grad_offset = run(program, x, f32(2), f32(0), f32(3), ones)
    # centered = x = [1, 2], variance + epsilon = 4, stddev 2, 2 elements per feature:
    # i1 = 2 * g = [2, 2], i2 = sum(g) = 2, i5 = sum(g * centered) * centered / 4
    # = [0.75, 1.5], grad_x = scale / stddev / 2 * (i1 - i2 - i5) = [-0.375, -0.75]
    np.testing.assert_array_equal(grad_x, np.array([[-0.375], [-0.75]], np.float32))
    np.testing.assert_array_equal(grad_scale, f32(1.5))  # sum(g * centered / stddev)
    np.testing.assert_array_equal(grad_offset, f32(2))  # sum(g)
