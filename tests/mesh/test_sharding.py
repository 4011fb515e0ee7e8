"""mesh.sharding: per-device pieces of a global array and back."""

import ml_dtypes
import numpy as np
import pytest

from mesh import sharding

SIZES = (2, 3)  # a 2x3 mesh


def test_pieces_are_views_in_device_order_and_assemble_back():
    x = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    layout = ((0,), (1,))  # dim 0 over mesh axis 0, dim 1 over axis 1
    pieces = sharding.pieces(x, layout, SIZES)
    assert all(np.shares_memory(p, x) for p in pieces)
    np.testing.assert_array_equal(pieces[4], x[2:4, 2:4])  # device (1, 1)
    np.testing.assert_array_equal(sharding.assemble(sharding.split(x, layout, SIZES), layout,
                                                    SIZES), x)


def test_replicated_pieces_are_one_array_and_need_not_be_compared():
    x = np.arange(6, dtype=np.float32)
    layout = ((1,),)  # replicated over mesh axis 0
    pieces = sharding.pieces(x, layout, SIZES)
    assert pieces[0] is not pieces[3] and np.shares_memory(pieces[0], pieces[3])
    np.testing.assert_array_equal(sharding.assemble(pieces, layout, SIZES), x)
    assert sharding.pieces(x, ((),), SIZES) == [x] * 6


def test_replicas_that_differ_are_an_error_equal_values_are_not():
    x = np.array([0.0, 1.0, np.nan], np.float32)
    other = x.copy()
    other[0] = -0.0  # other bits, an equal value
    assert not sharding.same_bits(x, other)
    np.testing.assert_array_equal(sharding.assemble([x, x, x, other, other, other], ((),),
                                                    SIZES), x)
    other[1] = 2.0
    with pytest.raises(ValueError, match="replicated over"):
        sharding.assemble([x, x, x, other, other, other], ((),), SIZES)


def test_pieces_of_different_shapes_are_an_error_scalars_assemble():
    with pytest.raises(ValueError, match=r"different shapes \[\(1,\), \(2,\)\]"):
        sharding.assemble([np.zeros(2)] * 3 + [np.zeros(1)] * 3, ((0,),), SIZES)
    scalar = np.asarray(1.5, ml_dtypes.bfloat16)
    whole = sharding.assemble([scalar] * 6, (), SIZES)
    assert whole.shape == () and whole.dtype == ml_dtypes.bfloat16 and whole == 1.5


def test_same_bits_compares_words_of_any_size():
    a = np.arange(7, dtype=ml_dtypes.bfloat16)  # 14 bytes: 2-byte words
    assert sharding.same_bits(a, a.copy())
    b = a.copy()
    b[6] = 100
    assert not sharding.same_bits(a, b)
    assert not sharding.same_bits(a, a.astype(np.float32))
    assert sharding.same_bits(np.float32(1.5).reshape(()), np.array(1.5, np.float32))


@pytest.mark.parametrize("layout", [((0,), (1,)), ((1,), (0,)), ((0, 1), ()), ((1, 0), ()),
                                    ((), (1,)), ((), ())])
def test_chip_pieces_are_the_pieces_of_the_array_unshard_assembles(layout):
    """The executor's array of the chips' pieces (mesh dims, 1 along axes the pieces do not
    vary), with a chip-dependent piece on every chip: unshard puts the piece of the chip at
    coordinate 0 along axes no dim is split over, and chip_pieces gives each device the
    same piece, as a view, without assembling."""
    used = {a for axes in layout for a in axes}
    mesh_dims = tuple(s if a in used else 1 for a, s in enumerate(SIZES))
    local = (2, 3)
    chips = np.arange(np.prod(mesh_dims + local), dtype=np.float32).reshape(mesh_dims + local)
    whole = sharding.unshard(chips, layout, SIZES)
    # assemble, from the devices' pieces of it, makes the same global array
    pieces = sharding.chip_pieces(chips, layout, SIZES)
    assert all(np.shares_memory(p, chips) for p in pieces)
    np.testing.assert_array_equal(sharding.assemble(pieces, layout, SIZES), whole)
    for piece, want in zip(pieces, sharding.pieces(whole, layout, SIZES)):
        np.testing.assert_array_equal(piece, want)


def test_unshard_takes_chip_zeros_piece_along_an_axis_no_dim_is_split_over():
    chips = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)  # varies on both axes
    whole = sharding.unshard(chips, ((0,),), SIZES)  # split over axis 0 only
    np.testing.assert_array_equal(whole, np.concatenate([chips[0, 0], chips[1, 0]]))
    assert [p.tolist() for p in sharding.chip_pieces(chips, ((0,),), SIZES)] == \
        [chips[0, 0].tolist()] * 3 + [chips[1, 0].tolist()] * 3


def test_device_pieces_are_each_devices_own_chips_piece():
    """Where the chips' pieces vary along an axis no dim is split over, each device keeps
    its own chip's (as XLA's devices keep their buffers); elsewhere the same views as
    chip_pieces."""
    chips = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)  # varies on both axes
    pieces = sharding.device_pieces(chips, SIZES)
    assert [p.tolist() for p in pieces] == [chips[i, j].tolist() for i in range(2)
                                            for j in range(3)]
    assert all(np.shares_memory(p, chips) for p in pieces)
    one_along_1 = chips[:, :1]
    for got, want in zip(sharding.device_pieces(one_along_1, SIZES),
                         sharding.chip_pieces(one_along_1, ((0,),), SIZES)):
        np.testing.assert_array_equal(got, want)


def test_layouts_that_differ_by_axes_of_size_one_are_equivalent():
    sizes = (1, 4, 2)
    assert sharding.equivalent(((0, 1), (2,)), ((1,), (2,)), sizes)
    assert not sharding.equivalent(((1, 2), ()), ((2, 1), ()), sizes)
    assert not sharding.equivalent(((1,),), ((1,), ()), sizes)


def test_a_value_held_one_array_per_chip_reads_as_the_whole():
    """PerChip: each chip's array, by the chip's index; the same pieces and global array as
    the whole array of the same values."""
    layout = ((0,), (1,))
    chips = np.arange(2 * 3 * 2 * 5, dtype=np.float32).reshape(SIZES + (2, 5))
    per_chip = sharding.PerChip([chips[i, j] for i in range(2) for j in range(3)], chips.shape)
    assert per_chip.shape == chips.shape and per_chip.dtype == np.float32
    assert np.shares_memory(per_chip[1, 2, ...], per_chip.arrays[5])
    np.testing.assert_array_equal(sharding.unshard(per_chip, layout, SIZES),
                                  sharding.unshard(chips, layout, SIZES))
    for got, want in zip(sharding.chip_pieces(per_chip, layout, SIZES),
                         sharding.chip_pieces(chips, layout, SIZES)):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(IndexError, match="chip's index along 2 mesh dims"):
        per_chip[1]
    with pytest.raises(ValueError, match="only as a copy"):
        np.asarray(per_chip, copy=False)
    with pytest.raises(ValueError, match="5 arrays for the chips"):
        sharding.PerChip(per_chip.arrays[:5], chips.shape)
