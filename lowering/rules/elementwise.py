"""Elementwise ops, constants, iota and device ids."""

from __future__ import annotations

import numpy as np

from lowering.registry import rule
from lowering.walker import LoweringContext, Op
from mesh import isa
from mesh.kernels.elementwise import BINARY, UNARY

# StableHLO and CHLO spellings of ops whose kernel name differs from the op name.
RENAMED = {"chlo.erf": "erf", "chlo.erf_inv": "erf_inv", "chlo.tan": "tan",
           "stablehlo.round_nearest_afz": "round_nearest_afz"}


def _elementwise(ctx: LoweringContext, op: Op):
    name = RENAMED.get(op.name, op.short_name)
    return ctx.emit(isa.Elementwise, op, op=name)


for _name in list(UNARY) + list(BINARY) + ["select", "clamp", "convert"]:
    rule(f"stablehlo.{_name}")(_elementwise)
rule(*(n for n in RENAMED if n.startswith("chlo.")))(_elementwise)


@rule("stablehlo.compare")
def compare(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Elementwise, op, op="compare", direction=op.attrs["comparison_direction"],
                    compare_type=op.attr("compare_type", ""))


@rule("stablehlo.constant")
def constant(ctx: LoweringContext, op: Op):
    value = np.asarray(op.attrs["value"])
    return ctx.emit(isa.Constant, op, value=value.reshape(op.result_types[0].shape))


@rule("stablehlo.iota")
def iota(ctx: LoweringContext, op: Op):
    return ctx.emit(isa.Iota, op, dimension=op.attrs["iota_dimension"])


@rule("stablehlo.partition_id", "stablehlo.replica_id")
def device_id(ctx: LoweringContext, op: Op):
    kind = "partition" if op.short_name == "partition_id" else "replica"
    varying = frozenset(range(ctx.mesh.rank)) if kind == "partition" else frozenset()
    return ctx.emit(isa.DeviceId, op, varying=varying, kind=kind)
