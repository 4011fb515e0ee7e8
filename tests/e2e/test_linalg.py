"""Dense linear algebra (the LAPACK custom calls jnp.linalg / jax.scipy.linalg emit for CPU,
and StableHLO's cholesky and triangular_solve) against CPU JAX.

Both sides run the same LAPACK routines on the same matrices, so results agree to the last
bits; RTOL leaves room only for the host BLAS choosing another blocking (thread count) for
the trailing updates: a few FP32 roundings on well-conditioned matrices (condition numbers
below 100 here: SPD matrices G G^T + n I, Gaussian tall matrices; the eigenvalues of the
Gaussian `general` matrices are well separated for this seed).
"""

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
from jax._src.lax import linalg as lax_linalg  # geqrf and ormqr have no public entry point
import pytest
from jax.sharding import PartitionSpec as P

import jax_trn2

RTOL, ATOL = 1e-5, 1e-5
N = 6


@pytest.fixture(scope="module")
def matrices():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((3, N, N)).astype(np.float32)
    spd = g @ np.swapaxes(g, -1, -2) + N * np.eye(N, dtype=np.float32)
    tall = rng.standard_normal((3, 8, 5)).astype(np.float32)
    rhs = rng.standard_normal((3, N, 2)).astype(np.float32)
    general = rng.standard_normal((3, N, N)).astype(np.float32)
    return {"spd": spd, "tall": tall, "rhs": rhs, "general": general}


CASES = {
    "cholesky": (lambda m: jnp.linalg.cholesky(m["spd"])),
    "qr_reduced": (lambda m: jnp.linalg.qr(m["tall"])),
    "qr_complete": (lambda m: jnp.linalg.qr(m["tall"], mode="complete")),
    "eigh_values": (lambda m: jnp.linalg.eigh(m["spd"])[0]),
    # eigenvectors and singular vectors up to sign: compare what they reconstruct
    "eigh_reconstruct": (lambda m: (lambda w, v: (v * w[..., None, :]) @ jnp.swapaxes(v, -1, -2))(
        *jnp.linalg.eigh(m["spd"]))),
    "svd_values": (lambda m: jnp.linalg.svd(m["tall"], compute_uv=False)),
    "svd_reconstruct": (lambda m: (lambda u, s, vt: (u * s[..., None, :]) @ vt)(
        *jnp.linalg.svd(m["tall"], full_matrices=False))),
    "svd_full_values": (lambda m: jnp.linalg.svd(m["tall"])[1]),
    "solve": (lambda m: jnp.linalg.solve(m["spd"], m["rhs"])),
    "inv": (lambda m: jnp.linalg.inv(m["spd"])),
    "det": (lambda m: jnp.linalg.det(m["spd"] / N)),
    "slogdet": (lambda m: jnp.linalg.slogdet(m["spd"])),
    "lu": (lambda m: jsl.lu(m["spd"][0])),  # jax's lu takes one matrix
    "lu_factor": (lambda m: jsl.lu_factor(m["spd"][1])),
    "solve_triangular": (lambda m: jsl.solve_triangular(jnp.tril(m["spd"]), m["rhs"],
                                                        lower=True, trans=1)),
    "cho_solve": (lambda m: jsl.cho_solve(jsl.cho_factor(m["spd"]), m["rhs"])),
}


# The other LAPACK routines jax emits on CPU: pivoted QR (geqp3), Q applied without forming
# it (ormqr), the QR-iteration SVD (gesvd), Hessenberg and tridiagonal reduction (gehrd,
# sytrd), the non-symmetric eigensolver (geev) and Schur decomposition (gees), and the
# tridiagonal solve (gtsv). Both sides run the same routine, so eigenvectors and Schur
# vectors agree as they are (LAPACK's normalisation), not only up to sign.
MORE_CASES = {
    "qr_pivoting": (lambda m: jsl.qr(m["tall"][0], pivoting=True)),
    "ormqr": (lambda m: lax_linalg.ormqr(*lax_linalg.geqrf(m["tall"][0]), m["tall"][1].T,
                                         left=False, transpose=True)),
    "svd_qr_algorithm": (lambda m: jax.lax.linalg.svd(
        m["tall"], algorithm=jax.lax.linalg.SvdAlgorithm.QR)),
    "hessenberg": (lambda m: jsl.hessenberg(m["general"][0], calc_q=True)),
    "tridiagonal": (lambda m: jax.lax.linalg.tridiagonal(m["spd"], lower=False)),
    "eig": (lambda m: jnp.linalg.eig(m["general"])),
    "eig_left": (lambda m: jax.lax.linalg.eig(m["general"], compute_right_eigenvectors=False)),
    "eigvals": (lambda m: jnp.linalg.eigvals(m["general"])),
    "schur": (lambda m: jsl.schur(m["general"][0])),
    "schur_form_only": (lambda m: jax.lax.linalg.schur(m["general"][1],
                                                       compute_schur_vectors=False)),
    "tridiagonal_solve": (lambda m: jax.lax.linalg.tridiagonal_solve(
        *(m["general"][0, :3] + np.array([[0], [N], [0]], np.float32)), m["rhs"][0])),
}


def _complex(m: dict) -> dict:
    """Hermitian positive definite `spd`, complex `tall`, `general` and `rhs` (conditioned
    as the real ones: G G^H + N I and Gaussian parts)."""
    rng = np.random.default_rng(1)
    out = {k: v + 1j * rng.standard_normal(v.shape).astype(np.float32) for k, v in m.items()}
    g = out["general"]
    out["spd"] = g @ np.swapaxes(g.conj(), -1, -2) + N * np.eye(N)
    return {k: v.astype(np.complex64) for k, v in out.items()}


@pytest.mark.parametrize("kind", ["real", "complex"])
@pytest.mark.parametrize("name", {**CASES, **MORE_CASES})
def test_linear_algebra_matches_cpu_jax(name, kind, matrices):
    f = {**CASES, **MORE_CASES}[name]
    m = matrices if kind == "real" else _complex(matrices)
    got, want = jax_trn2.jit(f)(m), jax.jit(f)(m)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_gradients_through_complex_factorisations(matrices):
    """The transposes of cholesky and triangular_solve conjugate with chlo.conj."""
    spd = _complex(matrices)["spd"][0]

    def loss(a):
        return jnp.sum(jnp.abs(jnp.linalg.cholesky(a)) ** 2) + jnp.abs(jnp.linalg.det(a))

    got, want = jax_trn2.jit(jax.grad(loss))(spd), jax.jit(jax.grad(loss))(spd)
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_factorisation_per_chip_in_shard_map(matrices):
    mesh = jax_trn2.make_mesh((2, 2), ("a", "b"))
    spd = np.concatenate([matrices["spd"], matrices["spd"][:1]])  # 4 matrices, one per chip

    def body(a):
        return jnp.linalg.cholesky(a), jnp.linalg.slogdet(a)[1]

    f = jax.shard_map(body, mesh=mesh, in_specs=P(("a", "b")), out_specs=P(("a", "b")))
    for g, w in zip(jax_trn2.jit(f)(spd), jax.jit(body)(spd)):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_lapack_status_reports_a_matrix_that_is_not_positive_definite():
    bad = -np.eye(3, dtype=np.float32)
    got, want = jax_trn2.jit(jnp.linalg.cholesky)(bad), jax.jit(jnp.linalg.cholesky)(bad)
    # jax turns LAPACK's nonzero info into NaNs in the factor's triangle: the same here
    assert np.isnan(np.asarray(got)[np.tril_indices(3)]).all()
    np.testing.assert_array_equal(got, want)


STABLEHLO = """
func.func public @main(%a: tensor<3x3xf32>, %b: tensor<3x2xf32>) -> (tensor<3x3xf32>, tensor<3x2xf32>) {
  %l = "stablehlo.cholesky"(%a) {lower = true} : (tensor<3x3xf32>) -> tensor<3x3xf32>
  %x = "stablehlo.triangular_solve"(%l, %b) {left_side = true, lower = true,
        unit_diagonal = false, transpose_a = #stablehlo<transpose TRANSPOSE>}
        : (tensor<3x3xf32>, tensor<3x2xf32>) -> tensor<3x2xf32>
  return %l, %x : tensor<3x3xf32>, tensor<3x2xf32>
}"""


def test_stablehlo_cholesky_and_triangular_solve():
    a = np.array([[4, 2, 0], [2, 5, 1], [0, 1, 3]], np.float32)
    b = np.array([[1, 2], [3, 4], [5, 6]], np.float32)
    factor, x = jax_trn2.client().compile(STABLEHLO).execute([a, b])
    lower = np.linalg.cholesky(a.astype(np.float64))
    np.testing.assert_allclose(np.tril(np.asarray(factor)), lower, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(x), np.linalg.solve(lower.T, b), rtol=1e-5)


def test_cost_counts_the_stated_flops():
    n = 256
    spd = jax.ShapeDtypeStruct((n, n), jnp.float32)
    cost = jax_trn2.jit(jnp.linalg.cholesky).lower(spd).compile().cost_analysis()
    assert cost["flops"] >= n ** 3 / 3  # potrf's n^3/3, plus the masking around it
    text = jax_trn2.jit(jnp.linalg.cholesky).lower(spd).as_text()
    assert "Tensor.LinearAlgebra(%" in text and "routine=potrf" in text


def test_cost_of_a_complex_factorisation_is_four_real_ones():
    n = 64
    real = jax.ShapeDtypeStruct((n, n), jnp.float32)
    complex_ = jax.ShapeDtypeStruct((n, n), jnp.complex64)

    def flops(a):
        return jax_trn2.jit(jnp.linalg.eigvalsh).lower(a).compile().cost_analysis()["flops"]

    assert flops(complex_) >= 4 * (4 * n ** 3 / 3)  # syevd without vectors, 4 real per complex
    assert flops(complex_) > 3.5 * flops(real)


def test_custom_call_without_a_rule_names_its_target_and_line():
    def f(x):
        return jax.ffi.ffi_call("my_solver", jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    with pytest.raises(jax_trn2.UnsupportedOpError, match=r"(?s)my_solver is not supported.*test_linalg.py"):
        jax_trn2.jit(f).lower(np.eye(3, dtype=np.float32))


@pytest.mark.parametrize("f, shape", [
    (jnp.linalg.det, (0, 0)), (jnp.linalg.inv, (2, 0, 0)), (jnp.linalg.cholesky, (0, 0)),
    (jsl.lu_factor, (0, 0)), (jsl.lu, (0, 3)), (jsl.lu, (3, 0)),
    (lambda a: jnp.linalg.solve(a, jnp.zeros((0, 2), a.dtype)), (0, 0))])
def test_empty_matrices_as_jax_jit(f, shape):
    """LAPACK's info of a matrix without a diagonal is 0 (det of a 0x0 matrix is 1)."""
    a = np.zeros(shape, np.float32)
    got, want = jax_trn2.jit(f)(a), jax.jit(f)(a)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
