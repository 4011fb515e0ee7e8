"""The ring collectives' order of additions (mesh.isa.kernels.ring_order): chunk c is added
from the member after its owner around the ring (c+1, ..., c), the second half of each
chunk the other way round, each partial sum rounded to the operand's type."""

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from mesh.isa.kernels.ring_order import ring_orders, ring_reduce


def test_a_bidirectional_ring_adds_each_half_chunk_its_own_way():
    """8 elements over a ring of 4: element pairs (2c, 2c+1) are chunk c; the first goes
    c+1, c+2, c+3, c; the second c-1, c-2, c-3, c."""
    (order,) = ring_orders([4], 8)
    np.testing.assert_array_equal(order, [[1, 3, 2, 0, 3, 1, 0, 2],
                                          [2, 2, 3, 3, 0, 0, 1, 1],
                                          [3, 1, 0, 2, 1, 3, 2, 0],
                                          [0, 0, 1, 1, 2, 2, 3, 3]])


def test_a_group_over_two_axes_has_a_ring_per_axis_owned_by_the_element_block():
    """4 elements over a 2x2 group: element e's owner is e, at coordinates (e // 2, e % 2);
    on each ring it is added from the next coordinate, then its own."""
    major, minor = ring_orders([2, 2], 4)
    np.testing.assert_array_equal(major, [[1, 1, 0, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(minor, [[1, 0, 1, 0], [0, 1, 0, 1]])


def test_a_member_the_same_on_every_chip_is_added_to_itself_with_each_sum_rounded():
    """A value replicated over a ring of 6 (member dim of size 1) is added to itself 5
    times, each partial rounded to BF16: 1 + 2^-7 gives 2 + 2^-6, then 3 + 3 * 2^-7 ties
    to 3 + 2^-5 (even), and each later + 1 + 2^-7 rounds back down: 4, 5, 6 + 2^-5. The
    exact 6x, 6 + 3 * 2^-6, would round (a tie) to 6 + 2^-4."""
    value = np.full((1, 2), 1 + 2.0 ** -7, ml_dtypes.bfloat16)
    got = ring_reduce(jnp.asarray(value), 0, [6], lax.add, None)
    np.testing.assert_array_equal(np.asarray(got, np.float32), [6 + 2.0 ** -5] * 2)
