"""Dense linear algebra and Fourier transforms: the LAPACK custom calls jnp.linalg and
jax.scipy.linalg emit for CPU (lapack_{s,d,c,z}<routine>_ffi, routines below) and
StableHLO's own `cholesky` and `triangular_solve`, as isa.LinearAlgebra
(mesh.isa.kernels.linalg); `stablehlo.fft` as isa.Fft (mesh.isa.kernels.fft)."""

from __future__ import annotations

from lowering.registry import custom_call_rule, rule
from lowering.walker import LoweringContext, Op
from mesh import isa

# LAPACK's routine names, real (s, d) and complex (c, z) spellings; the complex ones of
# orgqr, ormqr, syevd and sytrd are ungqr, unmqr, heevd and hetrd.
ROUTINES = {"potrf": "potrf", "getrf": "getrf", "geqrf": "geqrf", "geqp3": "geqp3",
            "orgqr": "ungqr", "ormqr": "unmqr", "syevd": "heevd", "gesdd": "gesdd",
            "gesvd": "gesvd", "gehrd": "gehrd", "sytrd": "hetrd", "geev": "geev",
            "gees": "gees", "gtsv": "gtsv", "trsm": "trsm"}
# LAPACK's character options, as jax's FFI calls name them in their backend config (ui8)
OPTION_NAMES = {"uplo": "uplo", "side": "side", "trans_x": "trans", "diag": "diag",
                "mode": "mode", "sort": "sort", "compute_left": "compute_left",
                "compute_right": "compute_right"}
# ormqr's boolean options: (LAPACK option, its value when true, when false)
FLAG_NAMES = {"left": ("side", "L", "R"), "transpose": ("trans", "T", "N")}


def _options(op: Op) -> tuple[tuple[str, str], ...]:
    config = op.backend_config
    options = [(OPTION_NAMES[k], chr(int(v))) for k, v in config.items() if k in OPTION_NAMES]
    options += [(FLAG_NAMES[k][0], FLAG_NAMES[k][1 if v else 2])
                for k, v in config.items() if k in FLAG_NAMES]
    if "low" in config or "high" in config:  # gehrd: reduce only rows/columns low..high
        n = op.operand_types[0].shape[-1]
        if (int(config.get("low", 1)), int(config.get("high", n))) != (1, n):
            raise NotImplementedError(f"gehrd of rows/columns {config.get('low')}.."
                                      f"{config.get('high')} of {n} (only the whole matrix)")
    return tuple(sorted(options))


def _lapack(routine: str):
    def lower(ctx: LoweringContext, op: Op):
        return ctx.emit(isa.LinearAlgebra, op, routine=routine, options=_options(op))
    return lower


for _routine, _complex_name in ROUTINES.items():
    custom_call_rule(*(f"lapack_{p}{_routine}_ffi" for p in "sd"),
                     *(f"lapack_{p}{_complex_name}_ffi" for p in "cz"))(_lapack(_routine))


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
