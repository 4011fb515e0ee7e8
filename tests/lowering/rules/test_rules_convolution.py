"""lowering/rules/convolution.py: convolution onto a Convolution instruction."""

import numpy as np
from jax import lax

from mesh import isa
from rule_lowering import lower_jax, only, out_type


def test_strided_dilated_grouped_convolution_attributes():
    def f(x, w):
        return lax.conv_general_dilated(x, w, window_strides=(2, 1), padding=((1, 1), (0, 2)),
                                        rhs_dilation=(1, 2), feature_group_count=2)

    x, w = np.ones((1, 4, 8, 8), np.float32), np.ones((6, 2, 3, 3), np.float32)
    program = lower_jax(f, x, w)
    conv = only(program, isa.Convolution)
    assert conv.window_strides == (2, 1)
    assert conv.padding == ((1, 1), (0, 2))
    assert (conv.lhs_dilation, conv.rhs_dilation) == ((1, 1), (1, 2))
    assert (conv.feature_group_count, conv.batch_group_count) == (2, 1)
    assert out_type(program, conv).shape == (1, 6, 4, 6)
