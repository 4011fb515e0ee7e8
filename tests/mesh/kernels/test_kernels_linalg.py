"""The linear algebra kernel (mesh.isa.kernels.linalg) called directly: LAPACK's results
and layout (packed factors, 1-based pivots, the triangle not asked for left as given) and
its `info` status, on 2 x 2 matrices worked by hand."""

import numpy as np
from kernel_harness import run_kernel

from mesh import isa

MATRIX = ((2, 2), "float32", set())
INFO = ((), "int32", set())


def lapack(routine: str, args, outs, **options):
    make = lambda o, i: isa.LinearAlgebra(o, i, routine=routine,
                                          options=tuple(options.items()))
    return [r[0] for r in run_kernel(make, [np.asarray(a, np.float32)[None] for a in args],
                                     outs, {"x": 1})]


def test_potrf_factors_one_triangle_and_reports_the_first_failing_minor():
    """[[4, 2], [2, 5]] = L L^T with L = [[2, 0], [1, 2]]; the upper triangle keeps the
    input's 2. [[1, 2], [2, 1]] is not positive definite at its second minor: info 2;
    [[4, 2, 0], [2, 5, 0], [0, 0, -1]] at its third: info 3 (LAPACK's dpotrf says so)."""
    factor, info = lapack("potrf", [[[4, 2], [2, 5]]], [MATRIX, INFO], uplo="L")
    np.testing.assert_allclose(factor, [[2, 2], [1, 2]])
    assert info == 0
    factor, info = lapack("potrf", [[[4, 2], [2, 5]]], [MATRIX, INFO], uplo="U")
    np.testing.assert_allclose(factor, [[2, 1], [2, 2]])  # U = L^T, the lower 2 kept
    _, info = lapack("potrf", [[[1, 2], [2, 1]]], [MATRIX, INFO], uplo="L")
    assert info == 2
    _, info = lapack("potrf", [[[4, 2, 0], [2, 5, 0], [0, 0, -1]]],
                     [((3, 3), "float32", set()), INFO], uplo="U")
    assert info == 3


def test_getrf_pivots_are_1_based_and_a_zero_pivot_is_reported():
    """[[1, 2], [3, 4]]: row 2 is the pivot, L's multiplier 1/3, U = [[3, 4], [0, 2/3]].
    [[1, 2], [2, 4]] is singular: its second pivot is 0, info 2."""
    pivots = ((2,), "int32", set())
    lu, pivot, info = lapack("getrf", [[[1, 2], [3, 4]]], [MATRIX, pivots, INFO])
    np.testing.assert_allclose(lu, [[3, 4], [1 / 3, 2 / 3]], rtol=1e-6)
    np.testing.assert_array_equal(pivot, [2, 2])
    assert info == 0
    lu, _, info = lapack("getrf", [[[1, 2], [2, 4]]], [MATRIX, pivots, INFO])
    np.testing.assert_allclose(lu, [[2, 4], [0.5, 0]])
    assert info == 2


def test_trsm_solves_with_the_triangle_and_unit_diagonal_asked_for():
    """[[2, 0], [1, 1]] x = [2, 3]: x = [1, 2]. With a unit diagonal the 2 is not read:
    [[1, 0], [1, 1]] x = [2, 3], x = [2, 1]. The upper triangle's 9 is never read."""
    a, b = [[2, 9], [1, 1]], [[2], [3]]
    column = ((2, 1), "float32", set())
    (x,) = lapack("trsm", [a, b], [column], side="L", uplo="L", trans="N", diag="N")
    np.testing.assert_allclose(x[:, 0], [1, 2])
    (x,) = lapack("trsm", [a, b], [column], side="L", uplo="L", trans="N", diag="U")
    np.testing.assert_allclose(x[:, 0], [2, 1])


def test_syevd_gives_eigenvalues_in_ascending_order():
    """[[2, 1], [1, 2]]: eigenvalues 1 and 3, eigenvectors (1, -1) and (1, 1) / sqrt(2)."""
    vectors, values, info = lapack("syevd", [[[2, 1], [1, 2]]],
                                   [MATRIX, ((2,), "float32", set()), INFO], uplo="L")
    np.testing.assert_allclose(values, [1, 3], rtol=1e-6)
    np.testing.assert_allclose(np.abs(vectors), np.full((2, 2), 0.5 ** 0.5), rtol=1e-6)
    assert info == 0


def test_gtsv_solves_a_tridiagonal_system_and_returns_its_diagonals_as_given():
    """[[2, 1], [1, 2]] x = [3, 3]: x = [1, 1]; dl[0] and du[-1] (here 7) are not read."""
    diagonal = ((2,), "float32", set())
    lower, main, upper, x, info = lapack(
        "gtsv", [[7, 1], [2, 2], [1, 7], [[3], [3]]],
        [diagonal, diagonal, diagonal, ((2, 1), "float32", set()), INFO])
    np.testing.assert_allclose(x[:, 0], [1, 1], rtol=1e-6)
    np.testing.assert_array_equal(lower, [7, 1])
    np.testing.assert_array_equal(upper, [1, 7])
    assert info == 0
