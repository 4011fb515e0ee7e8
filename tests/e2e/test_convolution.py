"""Convolutions as jax emits them (lax.conv_general_dilated, conv_transpose, their
gradients) inside shard_map bodies on the 4x4x4 mesh, compared with CPU JAX.

Tolerance: each output sums at most a few hundred FP32 products (in features x window),
in an order each backend picks; e2e_reference.FLOAT_RTOL (2**-14 relative to the largest
magnitude) covers any order for sums of that length. BF16 results are rounded once from
FP32 sums, so they may land one or two BF16 ulps apart (FLOAT_RTOL["bfloat16"]).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from e2e_reference import assert_matches, run_both

MESH = ((4, 4, 4), ("x", "y", "z"))


def test_conv_1d(rng):
    """1-D convolutions (NCW and NWC) with strides, padding, rhs and lhs dilation: images
    vary along x, weights along y, so each chip convolves its own pair."""
    x = rng.standard_normal((16, 6, 11)).astype(np.float32)  # N C W
    w = rng.standard_normal((16, 6, 3)).astype(np.float32)  # O I W

    def body(x, w):
        nwc = jnp.transpose(x, (0, 2, 1))
        return {
            "strided": lax.conv_general_dilated(x, w, (2,), [(1, 2)]),
            "rhs_dilated": lax.conv_general_dilated(x, w, (1,), "SAME", rhs_dilation=(2,)),
            "lhs_dilated": lax.conv_general_dilated(x, w, (1,), [(2, 2)], lhs_dilation=(3,)),
            "nwc": lax.conv_general_dilated(nwc, jnp.transpose(w, (2, 1, 0)), (1,), "VALID",
                                            dimension_numbers=("NWC", "WIO", "NWC")),
        }

    got, want = run_both(body, *MESH, (P("x"), P("y")), P("x", "y"), x, w)
    assert_matches(got, want)


def test_conv_2d_groups(rng):
    """2-D NHWC convolutions: a plain one with strides and negative padding, a grouped one
    (feature_group_count 2) and a depthwise one (a group per channel)."""
    x = rng.standard_normal((8, 7, 9, 4)).astype(np.float32)
    w = rng.standard_normal((3, 2, 4, 6)).astype(np.float32)  # H W I O
    w_grouped = rng.standard_normal((3, 3, 2, 6)).astype(np.float32)
    w_depthwise = rng.standard_normal((2, 2, 1, 8)).astype(np.float32)
    nhwc = ("NHWC", "HWIO", "NHWC")

    def body(x, w, w_grouped, w_depthwise):
        return {
            "plain": lax.conv_general_dilated(x, w, (2, 1), [(1, -1), (0, 2)],
                                              dimension_numbers=nhwc),
            "grouped": lax.conv_general_dilated(x, w_grouped, (1, 1), "SAME",
                                                dimension_numbers=nhwc, feature_group_count=2),
            "depthwise": lax.conv_general_dilated(x, w_depthwise, (1, 2), "VALID",
                                                  dimension_numbers=nhwc,
                                                  feature_group_count=4),
        }

    got, want = run_both(body, *MESH, (P("x"), P(), P(), P()), P("x"), x, w, w_grouped,
                         w_depthwise)
    assert_matches(got, want)


def test_conv_gradients(rng):
    """Gradients of a strided grouped 2-D convolution with respect to input and weights
    (convolutions with lhs dilation, and with batch_group_count for the weights), and
    conv_transpose; weights vary along y."""
    x = rng.standard_normal((8, 6, 6, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2, 4)).astype(np.float32)  # per-y H W I O

    def body(x, w):
        def loss(x, w):
            y = lax.conv_general_dilated(x, w[0], (2, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         feature_group_count=2)
            return jnp.sum(jnp.tanh(y))
        dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
        up = lax.conv_transpose(x, jnp.swapaxes(w[0], 2, 3), (2, 2), "SAME",
                                dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return {"dx": dx, "dw": dw, "transpose": up}

    got, want = run_both(body, *MESH, (P("x"), P("y")), P(("x", "y")), x, w)
    assert_matches(got, want)


def test_conv_bfloat16_to_float32(rng):
    """BF16 inputs with an FP32 result (preferred_element_type) and a BF16 result: the
    Tensor Engine reads BF16 exactly and sums in FP32."""
    x = rng.standard_normal((8, 5, 12)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((7, 5, 4)).astype(ml_dtypes.bfloat16)

    def body(x, w):
        return {"f32": lax.conv_general_dilated(x, w, (1,), "SAME",
                                                preferred_element_type=jnp.float32),
                "bf16": lax.conv_general_dilated(x, w, (3,), "VALID")}

    got, want = run_both(body, *MESH, (P("x"), P()), P("x"), x, w)
    assert_matches(got, want)


def test_cnn_training_step(rng):
    """A data-parallel training step of a small CNN (convolution, ReLU, max pooling, a
    dense layer, cross-entropy picking each label's log-probability): the gradients use
    convolutions, select_and_scatter and a scatter-add, then a pmean over all 64 chips,
    one image per chip. Sums of at most a few hundred FP32 terms: FLOAT_RTOL."""
    images = rng.standard_normal((64, 8, 8, 2)).astype(np.float32)
    labels = rng.integers(0, 5, (64,)).astype(np.int32)
    w_conv = (rng.standard_normal((3, 3, 2, 4)) * 0.3).astype(np.float32)
    w_dense = (rng.standard_normal((16, 5)) * 0.3).astype(np.float32)

    def step(images, labels, w_conv, w_dense):
        def loss(w_conv, w_dense):
            h = jax.nn.relu(lax.conv_general_dilated(
                images, w_conv, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")))
            h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            logp = jax.nn.log_softmax(jnp.mean(h, axis=-1).reshape(h.shape[0], -1) @ w_dense)
            return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

        value, grads = jax.value_and_grad(loss, argnums=(0, 1))(w_conv, w_dense)
        g_conv, g_dense = lax.pmean(grads, ("x", "y", "z"))
        return lax.pmean(value, ("x", "y", "z")), w_conv - 0.1 * g_conv, w_dense - 0.1 * g_dense

    batch = P(("x", "y", "z"))
    got, want = run_both(step, *MESH, (batch, batch, P(), P()), (P(), P(), P()), images,
                         labels, w_conv, w_dense)
    assert_matches(got, want)
