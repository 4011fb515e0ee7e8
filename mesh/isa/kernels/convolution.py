"""Convolution on the Tensor Engine.

Model (as for Matmul, see matmul.py): float inputs are read exactly in FP32, products are
summed in FP32 and the result is rounded once to the output type; integer inputs accumulate
exactly in the integer output type. Each chip convolves its own data (map_devices).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from mesh import dtypes, isa, numerics
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext
from mesh.isa.kernels.devices import map_devices


@kernel(isa.Convolution)
def convolution(instr: isa.Convolution, args, ctx: KernelContext):
    return map_devices(lambda lhs, rhs: [_convolve(instr, lhs, rhs, ctx)], args, ctx.nm)


def _convolve(instr: isa.Convolution, lhs, rhs, ctx: KernelContext):
    reversed_dims = tuple(d for d, flip in zip(instr.rhs_spec[2:], instr.window_reversal)
                          if flip)
    if reversed_dims:
        rhs = lax.rev(rhs, reversed_dims)
    if dtypes.is_float(instr.out_dtype):
        accumulate = jnp.promote_types(numerics.widen(lhs).dtype, numerics.widen(rhs).dtype)
    else:
        accumulate = dtypes.numpy_dtype(instr.out_dtype)
    out = lax.conv_general_dilated(
        lhs.astype(accumulate), rhs.astype(accumulate), instr.window_strides, instr.padding,
        lhs_dilation=instr.lhs_dilation, rhs_dilation=instr.rhs_dilation,
        dimension_numbers=lax.ConvDimensionNumbers(instr.lhs_spec, instr.rhs_spec,
                                                   instr.out_spec),
        feature_group_count=instr.feature_group_count,
        batch_group_count=instr.batch_group_count,
        precision=lax.Precision.HIGHEST, preferred_element_type=accumulate)
    return numerics.round_to(out, instr.out_dtype, ctx.rounding)
