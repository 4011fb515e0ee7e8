"""A mixture-of-experts layer written as users write it (a router with top-k, tokens sorted
by expert, jax.lax.ragged_dot for the expert MLPs with group sizes from the routing, then
unsorted and combined), through plain jax.jit on jax.devices("trn2") and through
jax_trn2.jit: values equal CPU JAX's, and the grouped matmul's memory and work (rows per
group), not the CPU's dense dot over every expert with a masked [experts, rows, d] operand.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_trn2
from e2e_reference import assert_same_bits
from mesh.executor import EXECUTOR_COMPILER_OPTIONS


def moe_layer(x, router, w_in, w_out, *, top_k: int):
    """x [tokens, d] through `top_k` of the experts w_in [E, d, f], w_out [E, f, d]."""
    tokens, d = x.shape
    logits = jnp.dot(x, router, preferred_element_type=jnp.float32)  # [tokens, E]
    gate_logits, chosen = jax.lax.top_k(logits, top_k)
    gates = jax.nn.softmax(gate_logits, axis=-1).astype(x.dtype)
    flat = chosen.reshape(-1)  # [tokens * top_k] expert of each (token, choice)
    order = jnp.argsort(flat)  # the rows sorted by expert
    rows = x[order // top_k]
    sizes = jnp.bincount(flat, length=router.shape[1]).astype(jnp.int32)
    hidden = jax.nn.gelu(jax.lax.ragged_dot(rows, w_in, sizes))
    out_rows = jax.lax.ragged_dot(hidden, w_out, sizes)
    unsorted = jnp.zeros_like(out_rows).at[order].set(out_rows).reshape(tokens, top_k, d)
    return jnp.einsum("tkd,tk->td", unsorted, gates)


def layer_arguments(rng, tokens, d, f, experts, dtype):
    scale = {"d": d ** -0.5, "f": f ** -0.5}
    return (rng.standard_normal((tokens, d)).astype(dtype),
            (rng.standard_normal((d, experts)) * scale["d"]).astype(dtype),
            (rng.standard_normal((experts, d, f)) * scale["d"]).astype(dtype),
            (rng.standard_normal((experts, f, d)) * scale["f"]).astype(dtype))


def on_trn2(args):
    return jax.device_put(args, jax.devices("trn2")[0])


# Error bounds in ulps of the output type, relative to the largest reference magnitude.
# FP32: the simulator's FP32 dots round each product to FP32 and add in another order than
# CPU JAX (a few ulps of a sum of K <= 48 terms: (K + 1) 2**-24 sum|a_k b_k|), gelu's tanh
# and softmax's exp may differ in their last bits, and the second dot and the combine
# carry those on: 16 ulps. BF16: both round every op's result to BF16 (EXECUTOR_COMPILER_OPTIONS on
# the CPU); a dot's FP32 sums of exact products, added in another order, may round to the
# neighbouring BF16 value: 2 ulps, as e2e_reference.FLOAT_RTOL.
ULPS = {"float32": (2.0 ** -23, 16), "bfloat16": (2.0 ** -7, 2)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layer_matches_cpu_jax_through_both_doors(dtype, rng):
    tokens, d, f, experts, top_k = 64, 32, 48, 8, 2
    args = layer_arguments(rng, tokens, d, f, experts, jnp.dtype(dtype))
    layer = functools.partial(moe_layer, top_k=top_k)
    want = np.asarray(jax.jit(layer, compiler_options=EXECUTOR_COMPILER_OPTIONS)(*args), np.float64)
    # the routing is not a near tie anywhere: a last-bit difference in a logit cannot
    # choose another expert (the k-th and next logits are far apart)
    logits = np.sort(np.asarray(args[0], np.float32) @ np.asarray(args[1], np.float32))
    assert (logits[:, -top_k] - logits[:, -top_k - 1]).min() > 1e-3
    got = jax_trn2.jit(layer)(*args)
    assert_same_bits(jax.jit(layer)(*on_trn2(args)), got)
    ulp, ulps = ULPS[dtype]
    scale = np.abs(want).max()
    error = np.abs(np.asarray(got, np.float64) - want).max()
    assert error <= ulps * ulp * scale, f"{error / (ulp * scale):.1f} ulps"


# A layer whose experts outnumber the rows per expert (64 experts, top-4 of 512 tokens):
# the grouped matmul holds the rows once, the CPU's dense formulation 64 times.
SHAPE = dict(tokens=512, d=64, f=64, experts=64, top_k=4)


def layer_shapes(tokens, d, f, experts, top_k, dtype=jnp.bfloat16):
    del top_k
    return (jax.ShapeDtypeStruct((tokens, d), dtype), jax.ShapeDtypeStruct((d, experts), dtype),
            jax.ShapeDtypeStruct((experts, d, f), dtype),
            jax.ShapeDtypeStruct((experts, f, d), dtype))


def compiled_both_ways(shapes, top_k):
    layer = functools.partial(moe_layer, top_k=top_k)
    trn2 = jax.sharding.SingleDeviceSharding(jax.devices("trn2")[0])
    plain = jax.jit(layer, in_shardings=trn2).lower(*shapes).compile()
    return plain, jax_trn2.jit(layer).lower(*shapes).compile()


def test_memory_is_weights_plus_activations_not_a_masked_operand_per_expert():
    """Hand formula (b = 2 bytes, R = tokens * top_k = 2048 rows): the arguments are
    x [tokens, d] and the weights (router d x E, two E x d x f) = 1.06 MB; the layer's
    activations are row tensors of d or f columns, each alive with at most one other:
    2 R (d + f) b = 1.05 MB bounds the temporaries. The CPU's dense formulation holds a
    masked copy of the rows per expert, E R d b = 16.8 MB: peak >= 17.8 MB, the grouped
    layer's <= 2.1 MB (8x less)."""
    tokens, d, f, experts, top_k = SHAPE.values()
    b, rows = 2, tokens * top_k
    arguments = (tokens * d + d * experts + 2 * experts * d * f) * b
    activations = 2 * rows * (d + f) * b
    dense_masked = arguments + experts * rows * d * b
    assert dense_masked >= 8 * (arguments + activations)
    plain, simulated = compiled_both_ways(layer_shapes(**SHAPE), top_k)
    for stats in (plain.memory_analysis(), simulated.memory_analysis()):
        assert stats.argument_size_in_bytes == arguments
        assert stats.temp_size_in_bytes <= activations
    assert simulated.memory_analysis().peak_memory_in_bytes <= arguments + activations


def test_cost_counts_the_rows_of_each_expert_once():
    """Each ragged_dot is costed as E matmuls of R / E rows (group sizes are runtime values:
    equal groups assumed), 2 R d f FLOPs, not the dense formulation's 2 E R d f. Hand
    formula of the layer: two expert dots 4 R d f, the router 2 tokens d E, and one FLOP
    per element of each elementwise op: at most 8 per element of the R x (d + f) rows
    (gelu's tanh form is 8 over R x f, the gate products and their sum 2 over R x d)."""
    tokens, d, f, experts, top_k = SHAPE.values()
    rows = tokens * top_k
    plain, simulated = compiled_both_ways(layer_shapes(**SHAPE), top_k)
    listing = simulated.as_text()
    grouped = re.findall(r"RaggedMatmul.*\n.*tensor engine: B=(\d+) M=(\d+) N=(\d+) K=(\d+)",
                         listing)
    assert sorted(tuple(map(int, g)) for g in grouped) == \
        [(experts, rows // experts, d, f), (experts, rows // experts, f, d)]
    matmuls = 4 * rows * d * f + 2 * tokens * d * experts
    for flops in (plain.cost_analysis()["flops"], simulated.cost_analysis()["flops"]):
        assert matmuls <= flops <= matmuls + 8 * rows * (d + f)


def test_a_decode_step_reads_only_the_experts_its_tokens_select():
    """2 tokens, top 2 of 64 experts: at most 4 experts hold rows, so the grouped matmuls
    read 4 experts' weights from HBM (selective expert loading, as NxD Inference's decode
    does), not all 64; a prefill of 512 tokens reads every expert's."""
    d, f, experts, top_k = 256, 512, 64, 2
    expert_bytes = d * f * 2  # one expert's weight matrix, bfloat16
    hbm = {}
    for tokens, holding in ((2, 4), (512, experts)):
        _, simulated = compiled_both_ways(
            layer_shapes(tokens=tokens, d=d, f=f, experts=experts, top_k=top_k), top_k)
        grouped = re.findall(r"RaggedMatmul.*\n.*tensor engine: B=(\d+) M=(\d+)",
                             simulated.as_text())
        assert [tuple(map(int, g)) for g in grouped] == \
            [(holding, tokens * top_k // holding)] * 2
        hbm[tokens] = simulated.cost_analysis()["bytes accessed"]
    # the decode step: its 4 experts' two weight matrices, plus a few KiB of tokens and
    # the router's 32 KiB, well under a fifth of the 64 experts'
    assert 2 * 4 * expert_bytes <= hbm[2] < 2 * 4 * expert_bytes + 2**20
    assert hbm[512] >= 2 * experts * expert_bytes
