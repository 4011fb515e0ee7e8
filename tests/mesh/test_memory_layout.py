"""Layouts: the order of an array's elements in memory, in jax's and XLA's spellings."""

import numpy as np
import pytest

from mesh import memory_layout


def test_xla_text_is_minor_to_major():
    assert memory_layout.text((0, 1, 2)) == "{2,1,0}"  # row-major
    assert memory_layout.parse("{0,1}", 2) == (1, 0)  # column-major
    assert memory_layout.parse("{}", 0) == ()
    assert memory_layout.parse(memory_layout.text((2, 0, 1)), 3) == (2, 0, 1)


def test_bad_layouts_are_refused_naming_them():
    with pytest.raises(ValueError, match=r"major_to_minor=\(0, 0\) does not order the 2 dims"):
        memory_layout.parse("{0,0}", 2)
    with pytest.raises(ValueError, match="'row-major' is not an XLA layout"):
        memory_layout.parse("row-major", 2)
    with pytest.raises(NotImplementedError, match=r"\{1,0:T\(8,128\)\} has tiles"):
        memory_layout.parse("{1,0:T(8,128)}", 2)


def test_in_memory_orders_the_elements_by_the_layout():
    x = np.arange(6).reshape(2, 3)
    assert memory_layout.in_memory(x, (0, 1)) is x
    np.testing.assert_array_equal(memory_layout.in_memory(x, (1, 0)).reshape(-1),
                                  [0, 3, 1, 4, 2, 5])
    assert memory_layout.in_memory(np.float32(1).reshape(()), ()).shape == ()
