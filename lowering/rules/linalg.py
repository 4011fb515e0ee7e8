"""Dense linear algebra and Fourier transforms: the LAPACK custom calls jnp.linalg and
jax.scipy.linalg emit for CPU (lapack_{s,d}{potrf,getrf,geqrf,orgqr,syevd,gesdd,trsm}_ffi)
and StableHLO's own `cholesky` and `triangular_solve`, as isa.LinearAlgebra
(mesh.isa.kernels.linalg); `stablehlo.fft` as isa.Fft (mesh.isa.kernels.fft)."""

from __future__ import annotations

from lowering.registry import custom_call_rule, rule
from lowering.walker import LoweringContext, Op
from mesh import isa

ROUTINES = ("potrf", "getrf", "geqrf", "orgqr", "syevd", "gesdd", "trsm")
# LAPACK's character options, as jax's FFI calls name them in their backend config
OPTION_NAMES = {"uplo": "uplo", "side": "side", "trans_x": "trans", "diag": "diag",
                "mode": "mode"}


def _lapack(routine: str):
    def lower(ctx: LoweringContext, op: Op):
        options = tuple(sorted((OPTION_NAMES[k], chr(int(v))) for k, v in op.backend_config.items()
                               if k in OPTION_NAMES))
        return ctx.emit(isa.LinearAlgebra, op, routine=routine, options=options)
    return lower


for _routine in ROUTINES:
    custom_call_rule(*(f"lapack_{p}{_routine}_ffi" for p in "sd"))(_lapack(_routine))


@rule("stablehlo.cholesky")
def cholesky(ctx: LoweringContext, op: Op):
    """The factor in the `lower` (default: upper) triangle; the spec leaves the other
    triangle implementation-defined: here it keeps the input, as LAPACK's potrf does."""
    uplo = "L" if op.attr("lower", False) else "U"
    (factor, _info) = ctx.emit(isa.LinearAlgebra, op,
                               out_types=(op.result_types[0],
                                          isa.TensorType(op.result_types[0].shape[:-2],
                                                         "int32")),
                               routine="potrf", options=(("uplo", uplo),))
    return (factor,)


@rule("stablehlo.triangular_solve")
def triangular_solve(ctx: LoweringContext, op: Op):
    transpose = str(op.attr("transpose_a", "NO_TRANSPOSE"))
    trans = "N" if "NO_TRANSPOSE" in transpose else "C" if "ADJOINT" in transpose else "T"
    options = (("diag", "U" if op.attr("unit_diagonal", False) else "N"),
               ("side", "L" if op.attr("left_side", False) else "R"),
               ("trans", trans), ("uplo", "L" if op.attr("lower", False) else "U"))
    return ctx.emit(isa.LinearAlgebra, op, routine="trsm", options=options)


@rule("stablehlo.fft")
def fft(ctx: LoweringContext, op: Op):
    """FFT, IFFT, RFFT, IRFFT over the last len(fft_length) dims (mesh.isa.kernels.fft)."""
    kind = str(op.attrs["fft_type"])
    fft_type = next(t for t in ("IRFFT", "RFFT", "IFFT", "FFT") if t in kind)
    return ctx.emit(isa.Fft, op, fft_type=fft_type,
                    fft_length=tuple(int(n) for n in op.attrs["fft_length"]))
