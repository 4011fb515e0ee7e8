"""Dense linear algebra with LAPACK's semantics: what the LAPACK custom calls that
jnp.linalg and jax.scipy.linalg emit for CPU compute, result for result.

Each routine is computed with jax's own linear-algebra primitives (on the CPU these call
the same LAPACK routines; elsewhere the backend's solver), batched over the leading dims
(the mesh dims and the program's batch dims), and returned in LAPACK's layout: packed
factors, 1-based pivots, Householder vectors and scalars, and an `info` status per matrix
(0 on success; for potrf and getrf the 1-based index of the failing minor or zero pivot,
as LAPACK reports it).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax._src.lax import linalg as lax_linalg  # geqrf has no public entry point

from mesh import isa
from mesh.isa.kernels import kernel
from mesh.isa.kernels.context import KernelContext


def _info_from_diagonal(diagonal: jnp.ndarray, failed: jnp.ndarray) -> jnp.ndarray:
    """LAPACK's info: the 1-based index of the first failing diagonal entry, else 0."""
    first = jnp.argmax(failed, axis=-1).astype(jnp.int32) + 1
    return jnp.where(failed.any(axis=-1), first, 0).astype(jnp.int32)


def potrf(a, instr: isa.LinearAlgebra):
    """Cholesky: the factor in the `uplo` triangle, the other triangle as given."""
    upper = instr.option("uplo") == "U"
    source = jnp.swapaxes(a, -1, -2) if upper else a  # the upper triangle, as a lower one
    factor = lax.linalg.cholesky(source, symmetrize_input=False)
    if upper:
        factor = jnp.swapaxes(factor, -1, -2)
    n = a.shape[-1]
    keep = jnp.triu(jnp.ones((n, n), bool)) if upper else jnp.tril(jnp.ones((n, n), bool))
    diagonal = jnp.diagonal(factor, axis1=-2, axis2=-1)
    info = _info_from_diagonal(diagonal, ~jnp.isfinite(diagonal))
    return [jnp.where(keep, factor, a), info]


def getrf(a, instr: isa.LinearAlgebra):
    """LU with partial pivoting: L (unit, below the diagonal) and U packed, 1-based pivots."""
    lu, pivots, _ = lax.linalg.lu(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return [lu, (pivots + 1).astype(jnp.int32), _info_from_diagonal(diagonal, diagonal == 0)]


def geqrf(a, instr: isa.LinearAlgebra):
    """QR as Householder reflectors: R above and on the diagonal, the vectors below, tau."""
    packed, taus = lax_linalg.geqrf(a)
    return [packed, taus]


def orgqr(a, taus, instr: isa.LinearAlgebra):
    """The orthogonal factor from geqrf's reflectors, as many columns as `a` has."""
    return [lax.linalg.householder_product(a, taus)]


def syevd(a, instr: isa.LinearAlgebra):
    """Symmetric eigendecomposition from the `uplo` triangle: eigenvectors (mode V) and
    eigenvalues in ascending order."""
    vectors, values = lax.linalg.eigh(a, lower=instr.option("uplo", "L") == "L",
                                      symmetrize_input=False)
    if instr.option("mode", "V") != "V":
        vectors = a  # mode N: LAPACK leaves the matrix destroyed; jax ignores it
    return [vectors, values, jnp.zeros(a.shape[:-2], jnp.int32)]


def gesdd(a, instr: isa.LinearAlgebra, out_shapes):
    """SVD: (a destroyed, s, u, vt, info) for mode A (full), S (reduced) or N (none)."""
    mode = instr.option("mode", "A")
    s_shape, u_shape, vt_shape = out_shapes[1:4]
    if mode == "N":
        s = lax.linalg.svd(a, compute_uv=False)
        u, vt = jnp.zeros(u_shape, a.dtype), jnp.zeros(vt_shape, a.dtype)
    else:
        u, s, vt = lax.linalg.svd(a, full_matrices=mode == "A")
    return [a, s, u, vt, jnp.zeros(a.shape[:-2], jnp.int32)]


def trsm(a, b, instr: isa.LinearAlgebra):
    """op(A) X = B (side L) or X op(A) = B (side R), A triangular (uplo), op by trans
    (N, T, C), unit diagonal when diag is U."""
    trans = instr.option("trans", "N")
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    b = jnp.broadcast_to(b, batch + b.shape[-2:])
    return [lax.linalg.triangular_solve(
        a, b, left_side=instr.option("side", "L") == "L", lower=instr.option("uplo") == "L",
        transpose_a=trans != "N", conjugate_a=trans == "C",
        unit_diagonal=instr.option("diag") == "U")]


@kernel(isa.LinearAlgebra)
def linear_algebra(instr: isa.LinearAlgebra, args, ctx: KernelContext):
    if instr.routine == "gesdd":
        results = gesdd(*args, instr, [ctx.out_shape(instr, i) for i in range(len(instr.outs))])
    else:
        results = ROUTINES[instr.routine](*args, instr)
    return [jnp.broadcast_to(r, ctx.out_shape(instr, i)).astype(ctx.out_info(instr, i).type.dtype)
            for i, r in enumerate(results)]


ROUTINES = {"potrf": potrf, "getrf": getrf, "geqrf": geqrf, "orgqr": orgqr, "syevd": syevd,
            "trsm": trsm}
