"""lowering/rules/movement.py: broadcast, reshape, transpose, slices, concatenate, pad,
reverse."""

import jax.numpy as jnp
import numpy as np
from jax import lax

from mesh import isa
from rule_lowering import lower_jax, only, out_type


def test_transpose_and_reverse_keep_their_dims():
    program = lower_jax(lambda x: jnp.flip(x.transpose(2, 0, 1), axis=1),
                        np.ones((2, 3, 4), np.float32))
    assert only(program, isa.Transpose).permutation == (2, 0, 1)
    reverse = only(program, isa.Reverse)
    assert reverse.dimensions == (1,)
    assert out_type(program, reverse).shape == (4, 2, 3)


def test_strided_slice_pad_and_concatenate_attributes():
    def f(x):
        s = x[1:7:3]
        return jnp.concatenate([lax.pad(s, np.float32(0), [(1, 2, 1)]), s])

    program = lower_jax(f, np.ones(8, np.float32))
    slice_ = only(program, isa.Slice)
    assert (slice_.start, slice_.limit, slice_.strides) == ((1,), (7,), (3,))
    pad = only(program, isa.Pad)
    assert (pad.low, pad.high, pad.interior) == ((1,), (2,), (1,))
    concat = only(program, isa.Concatenate)
    assert concat.dimension == 0
    assert out_type(program, concat).shape == (8,)  # 1 + 2 + 1 + 2 padded, then 2


def test_broadcast_in_dim_maps_operand_dims_to_result_dims():
    program = lower_jax(lambda x: lax.broadcast_in_dim(x, (3, 5), (0,)),
                        np.ones(3, np.float32))
    broadcast = only(program, isa.BroadcastInDim)
    assert (broadcast.dimensions, broadcast.shape) == ((0,), (3, 5))
