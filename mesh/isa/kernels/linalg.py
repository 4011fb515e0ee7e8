"""Dense linear algebra with LAPACK's semantics: what the LAPACK custom calls that
jnp.linalg and jax.scipy.linalg emit for CPU compute, result for result, in real and
complex types.

Each routine is computed with jax's own linear-algebra primitives (on the CPU these call
the same LAPACK routines; elsewhere the backend's solver), batched over the leading dims
(the mesh dims and the program's batch dims), and returned in LAPACK's layout: packed
factors, 1-based pivots, Householder vectors and scalars, and an `info` status per matrix
(0 on success; for potrf and getrf the 1-based index of the failing minor or zero pivot,
as LAPACK reports it). Outputs that LAPACK overwrites with workspace and jax ignores (the
matrix gesdd destroys, gtsv's factored diagonals) hold the input unchanged.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax._src.lax import linalg as lax_linalg  # geqrf, geqp3, ormqr: no public entry point

from mesh import isa
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext


def _info_from_diagonal(diagonal: jnp.ndarray, failed: jnp.ndarray) -> jnp.ndarray:
    """LAPACK's info: the 1-based index of the first failing diagonal entry, else 0 (also
    for an empty matrix, which has no diagonal)."""
    if failed.shape[-1] == 0:
        return jnp.zeros(failed.shape[:-1], jnp.int32)
    first = jnp.argmax(failed, axis=-1).astype(jnp.int32) + 1
    return jnp.where(failed.any(axis=-1), first, 0).astype(jnp.int32)


def _ok(a: jnp.ndarray) -> jnp.ndarray:
    """info = 0 for each matrix of `a` (routines whose failures jax cannot report)."""
    return jnp.zeros(a.shape[:-2], jnp.int32)


def potrf(instr: isa.LinearAlgebra, shapes, a):
    """Cholesky: the factor in the `uplo` triangle, the other triangle as given."""
    upper = instr.option("uplo") == "U"
    # the upper triangle, as a lower one: A = U^H U, so U^H is the lower factor of A^H
    source = jnp.swapaxes(a, -1, -2).conj() if upper else a
    factor = lax.linalg.cholesky(source, symmetrize_input=False)
    if upper:
        factor = jnp.swapaxes(factor, -1, -2).conj()
    n = a.shape[-1]
    keep = jnp.triu(jnp.ones((n, n), bool)) if upper else jnp.tril(jnp.ones((n, n), bool))
    failed = ~jnp.isfinite(jnp.diagonal(factor, axis1=-2, axis2=-1)).all(-1)
    # jax fills a failed factor with NaNs, so its diagonal does not say where it failed
    info = lax.cond(failed.any(), lambda: _first_failing_minor(source),
                    lambda: jnp.zeros(failed.shape, jnp.int32))
    return [jnp.where(keep, factor, a), jnp.where(failed, info, 0)]


def _not_positive_definite(a: jnp.ndarray, k: jnp.ndarray) -> jnp.ndarray:
    """Whether the leading k x k minor of each matrix of `a` (from its lower triangle;
    k [batch...]) has no Cholesky factor: the factor of the minor bordered by the identity
    is not finite."""
    inside = jnp.arange(a.shape[-1]) < k[..., None]
    minor = jnp.where(inside[..., :, None] & inside[..., None, :], a,
                      jnp.eye(a.shape[-1], dtype=a.dtype))
    factor = lax.linalg.cholesky(minor, symmetrize_input=False)
    return ~jnp.isfinite(jnp.diagonal(factor, axis1=-2, axis2=-1)).all(-1)


def _first_failing_minor(a: jnp.ndarray) -> jnp.ndarray:
    """potrf's info for matrices (lower triangle) with no Cholesky factor: the order of
    the first leading minor that is not positive definite, found by bisection (a minor
    containing one that fails fails too), log2(n) + 1 factorisations."""
    n = a.shape[-1]
    good = jnp.zeros(a.shape[:-2], jnp.int32)  # a leading minor known to factor
    bad = jnp.full(a.shape[:-2], n, jnp.int32)  # one known not to

    def halve(_, bounds):
        good, bad = bounds
        middle = (good + bad + 1) // 2
        fails = _not_positive_definite(a, middle)
        return jnp.where(fails, good, middle), jnp.where(fails, middle, bad)

    _, bad = lax.fori_loop(0, n.bit_length(), halve, (good, bad))
    return bad


def getrf(instr: isa.LinearAlgebra, shapes, a):
    """LU with partial pivoting: L (unit, below the diagonal) and U packed, 1-based pivots."""
    lu, pivots, _ = lax.linalg.lu(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    return [lu, (pivots + 1).astype(jnp.int32), _info_from_diagonal(diagonal, diagonal == 0)]


def geqrf(instr: isa.LinearAlgebra, shapes, a):
    """QR as Householder reflectors: R above and on the diagonal, the vectors below, tau."""
    return list(lax_linalg.geqrf(a))


def geqp3(instr: isa.LinearAlgebra, shapes, a, jpvt):
    """QR with column pivoting: geqrf's layout plus the 1-based column permutation (jpvt
    nonzero on entry marks columns LAPACK moves to the front)."""
    return list(lax_linalg.geqp3(a, jpvt, use_magma=False))


def orgqr(instr: isa.LinearAlgebra, shapes, a, taus):
    """The orthogonal (unitary: ungqr) factor from geqrf's reflectors, as many columns as
    `a` has."""
    return [lax.linalg.householder_product(a, taus)]


def ormqr(instr: isa.LinearAlgebra, shapes, a, taus, c):
    """Q C, Q^T C (Q^H for complex: unmqr), C Q or C Q^T from geqrf's reflectors."""
    return [lax_linalg.ormqr(a, taus, c, left=instr.option("side", "L") == "L",
                             transpose=instr.option("trans", "N") != "N")]


def syevd(instr: isa.LinearAlgebra, shapes, a):
    """Symmetric (Hermitian: heevd) eigendecomposition from the `uplo` triangle:
    eigenvectors (mode V) and eigenvalues in ascending order."""
    vectors, values = lax.linalg.eigh(a, lower=instr.option("uplo", "L") == "L",
                                      symmetrize_input=False)
    if instr.option("mode", "V") != "V":
        vectors = a  # mode N: LAPACK leaves the matrix destroyed; jax ignores it
    return [vectors, values, _ok(a)]


def gesdd(instr: isa.LinearAlgebra, shapes, a):
    """SVD (gesdd, or gesvd's algorithm for gesvd): (a destroyed, s, u, vt, info) for mode
    A (full), S (reduced) or N (none)."""
    mode = instr.option("mode", "A")
    algorithm = (lax.linalg.SvdAlgorithm.QR if instr.routine == "gesvd"
                 else lax.linalg.SvdAlgorithm.DEFAULT)
    if mode == "N":
        s = lax.linalg.svd(a, compute_uv=False, algorithm=algorithm)
        u, vt = jnp.zeros(shapes[2], a.dtype), jnp.zeros(shapes[3], a.dtype)
    else:
        u, s, vt = lax.linalg.svd(a, full_matrices=mode == "A", algorithm=algorithm)
    return [a, s, u, vt, _ok(a)]


def gehrd(instr: isa.LinearAlgebra, shapes, a):
    """Hessenberg reduction: H on and above the subdiagonal, the reflectors below, tau."""
    packed, taus = lax_linalg.hessenberg(a)
    return [packed, taus, _ok(a)]


def sytrd(instr: isa.LinearAlgebra, shapes, a):
    """Tridiagonal reduction of a symmetric (Hermitian: hetrd) matrix from the `uplo`
    triangle: the packed reflectors, the diagonal, the off-diagonal and tau."""
    packed, diagonal, off, taus = lax.linalg.tridiagonal(
        a, lower=instr.option("uplo", "L") == "L")
    return [packed, diagonal, off, taus, _ok(a)]


def geev(instr: isa.LinearAlgebra, shapes, a):
    """Eigenvalues and left/right eigenvectors of a general matrix: (wr, wi, vl, vr, info)
    for a real matrix, (w, vl, vr, info) for a complex one; the eigenvectors are complex
    (as jax's FFI call returns them), zeros where not asked for."""
    left, right = instr.option("compute_left") == "V", instr.option("compute_right") == "V"
    results = lax.linalg.eig(a, compute_left_eigenvectors=left,
                             compute_right_eigenvectors=right)
    w, vectors = results[0], iter(results[1:])
    vl = next(vectors) if left else jnp.zeros(shapes[-3], w.dtype)
    vr = next(vectors) if right else jnp.zeros(shapes[-2], w.dtype)
    values = [w.real, w.imag] if len(shapes) == 5 else [w]
    return [*values, vl, vr, _ok(a)]


def _quasi_triangular_eigenvalues(t: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(real, imaginary parts) of the eigenvalues of a real Schur form in LAPACK's
    standard form: 1x1 blocks, and 2x2 blocks [[a, b], [c, a]] with b c < 0 holding the
    pair a +- i sqrt(-b c), the + first."""
    diagonal = jnp.diagonal(t, axis1=-2, axis2=-1)
    below = jnp.diagonal(t, offset=-1, axis1=-2, axis2=-1)  # t[i+1, i]
    above = jnp.diagonal(t, offset=1, axis1=-2, axis2=-1)  # t[i, i+1]
    pair = jnp.sqrt(jnp.abs(above * below)) * (below != 0)
    zero = jnp.zeros(pair.shape[:-1] + (1,), pair.dtype)
    # the top row of a block gets +, the bottom row -
    imaginary = jnp.concatenate([pair, zero], -1) - jnp.concatenate([zero, pair], -1)
    return diagonal, imaginary


def gees(instr: isa.LinearAlgebra, shapes, a):
    """Schur form and Schur vectors (mode V; the input where not asked for), unsorted:
    (T, Z, wr, wi, sdim, info) for a real matrix, (T, Z, w, sdim, info) for a complex one."""
    if instr.option("sort", "N") != "N":
        raise NotImplementedError("gees with sorted eigenvalues (jax does not emit it)")
    vectors = instr.option("mode", "V") == "V"
    results = lax.linalg.schur(a, compute_schur_vectors=vectors)
    t = results[0]
    z = results[1] if vectors else a
    if len(shapes) == 6:
        values = list(_quasi_triangular_eigenvalues(t))
    else:
        values = [jnp.diagonal(t, axis1=-2, axis2=-1)]
    return [t, z, *values, _ok(a), _ok(a)]


def gtsv(instr: isa.LinearAlgebra, shapes, lower, diagonal, upper, b):
    """Tridiagonal solve (dl, d, du: the sub-, main and superdiagonal, dl[0] and du[-1]
    unused): (dl, d, du as given, x, info)."""
    x = lax.linalg.tridiagonal_solve(lower, diagonal, upper, b)
    return [lower, diagonal, upper, x, jnp.zeros(b.shape[:-2], jnp.int32)]


def trsm(instr: isa.LinearAlgebra, shapes, a, b):
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


ROUTINES = {"potrf": potrf, "getrf": getrf, "geqrf": geqrf, "geqp3": geqp3,
            "orgqr": orgqr, "ormqr": ormqr, "syevd": syevd, "gesdd": gesdd, "gesvd": gesdd,
            "gehrd": gehrd, "sytrd": sytrd, "geev": geev, "gees": gees, "gtsv": gtsv,
            "trsm": trsm}


@kernel(isa.LinearAlgebra)
def linear_algebra(instr: isa.LinearAlgebra, args, ctx: KernelContext):
    shapes = [ctx.out_shape(instr, i) for i in range(len(instr.outs))]
    results = ROUTINES[instr.routine](instr, shapes, *args)
    return [jnp.broadcast_to(r, shapes[i]).astype(ctx.out_info(instr, i).type.dtype)
            for i, r in enumerate(results)]
