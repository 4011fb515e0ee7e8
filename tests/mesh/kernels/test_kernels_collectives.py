"""The collectives' kernels (mesh.isa.kernels.collectives) called directly over a 1-D mesh
of 4 chips: sums in the ring's order, each partial rounded to the operand's type; gathers
and exchanges in the groups' rank order."""

import ml_dtypes
import numpy as np
from kernel_harness import run_kernel

from mesh import isa

RING = isa.Groups(((0, 1, 2, 3),), axes=(0,))
MESH = {"x": 4}


def bf16_members() -> np.ndarray:
    """[chip, 4] BF16: element 0 is 1, 1, 256, 0 on chips 0..3 (owner 0: the ring adds
    chips 1, 2, 3, 0: 1 + 256 ties to 256, and the last 1 too: 256; in rank order 1 + 1 +
    256 = 258); element 1 is 256, 0, 1, 1 (owner 1: chips 2, 3, 0, 1: 1 + 1 + 256 = 258;
    in rank order 256); elements 2 and 3 are each chip's id (0 + 1 + 2 + 3 = 6)."""
    x = np.zeros((4, 4), np.float32)
    x[:, 0] = [1, 1, 256, 0]
    x[:, 1] = [256, 0, 1, 1]
    x[:, 2] = x[:, 3] = np.arange(4)
    return x.astype(ml_dtypes.bfloat16)


def test_all_reduce_adds_bf16_in_ring_order_rounding_each_partial():
    make = lambda outs, ins: isa.AllReduce(outs, ins, groups=RING, reduction="add")
    (out,) = run_kernel(make, [bf16_members()], [((4,), "bfloat16", set())], MESH)
    assert out.shape == (1, 4)  # replicated: one copy
    np.testing.assert_array_equal(out.astype(np.float32), [[256, 258, 6, 6]])


def test_reduce_scatter_gives_member_r_block_r_summed_in_its_ring_order():
    make = lambda outs, ins: isa.ReduceScatter(outs, ins, groups=RING, dimension=0,
                                               reduction="add")
    (out,) = run_kernel(make, [bf16_members()], [((1,), "bfloat16", {0})], MESH)
    np.testing.assert_array_equal(out.astype(np.float32), [[256], [258], [6], [6]])


def test_all_gather_concatenates_in_the_groups_rank_order():
    """Groups that are not mesh lines, members listed out of id order: chips 1 and 3 get
    chip 3's piece then chip 1's; chips 0 and 2 get chip 2's then chip 0's."""
    groups = isa.Groups(((3, 1), (2, 0)), axes=None)
    x = np.array([[10], [11], [12], [13]], np.int32)
    make = lambda outs, ins: isa.AllGather(outs, ins, groups=groups, dimension=0)
    (out,) = run_kernel(make, [x], [((2,), "int32", {0})], MESH)
    np.testing.assert_array_equal(out, [[12, 10], [13, 11], [12, 10], [13, 11]])


def test_all_to_all_sends_block_r_to_member_r():
    """Chip s holds [4s, 4s+1, 4s+2, 4s+3]; chip r receives block r of every chip, in
    sender order: [r, 4 + r, 8 + r, 12 + r]."""
    x = np.arange(16, dtype=np.int32).reshape(4, 4)
    make = lambda outs, ins: isa.AllToAll(outs, ins, groups=RING, split_dimension=0,
                                          concat_dimension=0)
    (out,) = run_kernel(make, [x], [((4,), "int32", {0})], MESH)
    np.testing.assert_array_equal(out, x.T)


def test_collective_permute_zeros_chips_no_one_sends_to():
    x = np.array([[1.5], [2.5], [3.5], [4.5]], np.float32)
    make = lambda outs, ins: isa.CollectivePermute(outs, ins, pairs=((0, 1), (1, 2), (3, 0)))
    (out,) = run_kernel(make, [x], [((1,), "float32", {0})], MESH)
    np.testing.assert_array_equal(out, [[4.5], [1.5], [2.5], [0.0]])
