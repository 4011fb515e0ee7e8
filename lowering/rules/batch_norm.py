"""batch_norm_inference, batch_norm_training and batch_norm_grad, expanded into the
elementwise ops, broadcasts and sums the StableHLO spec defines them by (jax never emits
them: its batch norm is already those ops)."""

from __future__ import annotations

import numpy as np

from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import dtypes, isa


class _Expansion:
    """Emits the spec's helper functions for one batch_norm op over its operand's shape."""

    def __init__(self, ctx: LoweringContext, op: Op):
        self.ctx, self.op = ctx, op
        self.feature = op.attrs["feature_index"]
        self.full = op.operand_types[0]
        self.per_feature = isa.TensorType((self.full.shape[self.feature],), self.full.dtype)

    def constant(self, value: float) -> int:
        scalar = isa.TensorType((), self.full.dtype)
        (out,) = self.ctx.emit(isa.Constant, self.op, ins=(), out_types=(scalar,),
                               varying=frozenset(),
                               value=np.array(value, dtypes.numpy_dtype(self.full.dtype)))
        return out

    def broadcast(self, value: int, dimensions: tuple[int, ...]) -> int:
        (out,) = self.ctx.emit(isa.BroadcastInDim, self.op, ins=(value,),
                               out_types=(self.full,), dimensions=dimensions,
                               shape=self.full.shape)
        return out

    def per_element(self, value: int) -> int:
        """A per-feature value broadcast along the operand's feature dimension."""
        return self.broadcast(value, (self.feature,))

    def splat(self, value: float) -> int:
        return self.broadcast(self.constant(value), ())

    def apply(self, name: str, lhs: int, rhs: int) -> int:
        (out,) = self.ctx.emit(isa.Elementwise, self.op, ins=(lhs, rhs),
                               out_types=(self.ctx.type(lhs),), op=name)
        return out

    def sqrt(self, value: int) -> int:
        (out,) = self.ctx.emit(isa.Elementwise, self.op, ins=(value,),
                               out_types=(self.full,), op="sqrt")
        return out

    def sum(self, value: int) -> int:
        """compute_sum: the sum over every dimension but the feature one."""
        others = tuple(d for d in range(self.full.rank) if d != self.feature)
        (out,) = self.ctx.emit(isa.Reduce, self.op, ins=(value, self.constant(0)),
                               out_types=(self.per_feature,), dimensions=others,
                               combiner="add")
        return out

    def elements_per_feature(self) -> float:
        return self.full.size / self.full.shape[self.feature]

    def mean(self, value: int) -> int:
        """compute_mean: the sum over every dimension but the feature one, divided by the
        number of elements summed."""
        count = self.broadcast_per_feature(self.constant(self.elements_per_feature()))
        return self.apply("divide", self.sum(value), count)

    def broadcast_per_feature(self, scalar: int) -> int:
        (out,) = self.ctx.emit(isa.BroadcastInDim, self.op, ins=(scalar,),
                               out_types=(self.per_feature,), dimensions=(),
                               shape=self.per_feature.shape)
        return out

    def variance(self, mean: int) -> int:
        """compute_variance: the mean of the squared distances from `mean`."""
        centered = self.apply("subtract", self.op.operands[0], self.per_element(mean))
        return self.mean(self.apply("multiply", centered, centered))

    def normalize(self, scale: int, offset: int, mean: int, variance: int) -> int:
        """batch_norm_inference's result: scale * (operand - mean) / stddev + offset."""
        operand = self.op.operands[0]
        centered = self.apply("subtract", operand, self.per_element(mean))
        stddev = self.sqrt(self.apply("add", self.per_element(variance),
                                      self.splat(self.op.attrs["epsilon"])))
        normalized = self.apply("divide", centered, stddev)
        return self.apply("add", self.apply("multiply", self.per_element(scale), normalized),
                          self.per_element(offset))


@rule("stablehlo.batch_norm_inference")
def batch_norm_inference(ctx: LoweringContext, op: Op):
    _operand, scale, offset, mean, variance = op.operands
    return (_Expansion(ctx, op).normalize(scale, offset, mean, variance),)


@rule("stablehlo.batch_norm_training")
def batch_norm_training(ctx: LoweringContext, op: Op):
    _operand, scale, offset = op.operands
    x = _Expansion(ctx, op)
    mean = x.mean(op.operands[0])
    variance = x.variance(mean)
    return x.normalize(scale, offset, mean, variance), mean, variance


@rule("stablehlo.batch_norm_grad")
def batch_norm_grad(ctx: LoweringContext, op: Op):
    """The spec's expansion (the one XLA's batchnorm_expander computes)."""
    operand, scale, mean, variance, grad_output = op.operands
    x = _Expansion(ctx, op)
    centered = x.apply("subtract", operand, x.per_element(mean))
    variance_plus_epsilon = x.apply("add", x.per_element(variance),
                                    x.splat(op.attrs["epsilon"]))
    stddev = x.sqrt(variance_plus_epsilon)
    normalized = x.apply("divide", centered, stddev)
    count = x.splat(x.elements_per_feature())
    i1 = x.apply("multiply", grad_output, count)
    i2 = x.per_element(x.sum(grad_output))
    i3 = x.per_element(x.sum(x.apply("multiply", grad_output, centered)))
    i5 = x.apply("divide", x.apply("multiply", i3, centered), variance_plus_epsilon)
    i6 = x.apply("subtract", x.apply("subtract", i1, i2), i5)
    grad_operand = x.apply("multiply", x.apply("divide", x.apply(
        "divide", x.per_element(scale), stddev), count), i6)
    grad_scale = x.sum(x.apply("multiply", grad_output, normalized))
    grad_offset = x.sum(grad_output)
    return grad_operand, grad_scale, grad_offset
