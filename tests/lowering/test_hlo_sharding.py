"""GSPMD shardings (mhlo.sharding text): parsing, the mesh they are made of, and tilings read
as mesh axes per dim."""

from __future__ import annotations

import pytest

from lowering import hlo_sharding
from mesh import isa

MESH_444 = isa.MeshSpec(("d0", "d1", "d2"), (4, 4, 4))


@pytest.mark.parametrize("text", ["{replicated}", "{manual}", "{maximal device=3}"])
def test_untiled_shardings_have_no_tiling(text):
    assert hlo_sharding.parse(text) is None


@pytest.mark.parametrize("text, axes", [
    ("{devices=[4,4,4]<=[64]}", ((0,), (1,), (2,))),
    ("{devices=[16,4]<=[4,4,4]T(0,2,1)}", ((0, 2), (1,))),  # dim 0 over x then z
    ("{devices=[4,1,16]<=[4,4,4]T(1,0,2) last_tile_dim_replicate}", ((1,), ())),
    ("{devices=[1,4,16]<=[64] last_tile_dim_replicate}", ((), (0,))),
    # <=[4,4,4]T(1,0,2) written out: dim 0 steps through y, the replicated dim x then z.
    ("{devices=[4,1,16]" + ",".join(str(4 * y + 16 * (j // 4) + j % 4)
                                    for y in range(4) for j in range(16))
     + " last_tile_dim_replicate}", ((1,), ())),
])
def test_tilings_as_mesh_axes(text, axes):
    tiling = hlo_sharding.parse(text)
    assert hlo_sharding.dim_axes(tiling, MESH_444)[:len(axes)] == axes


def test_explicit_device_list_reads_like_its_iota_form():
    explicit = hlo_sharding.parse("{devices=[2,2]0,2,1,3}")
    assert hlo_sharding.dim_axes(explicit, isa.MeshSpec(("a", "b"), (2, 2))) == ((1,), (0,))


@pytest.mark.parametrize("text, follows", [
    ("{devices=[2,2]0,1,2,3}", True),
    ("{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}", True),  # dim 0 over the minor axis
    ("{devices=[2,2]3,2,1,0}", False),  # the mesh's devices reversed (jax's device ids)
    ("{devices=[4]0,2,1,3}", True),  # over y then x
    ("{devices=[4]0,3,1,2}", False),
])
def test_tilings_over_the_meshs_devices_in_another_order(text, follows):
    mesh = isa.MeshSpec(("x", "y"), (2, 2))
    assert hlo_sharding.follows_mesh(hlo_sharding.parse(text), mesh) is follows


def test_mesh_is_cut_where_any_tiling_steps():
    tilings = [hlo_sharding.parse("{devices=[4,1,16]<=[64] last_tile_dim_replicate}"),
               hlo_sharding.parse("{devices=[16,4]<=[4,4,4]T(0,2,1)}")]
    assert hlo_sharding.infer_mesh(tilings, 64).axis_sizes == (4, 4, 4)
    assert hlo_sharding.infer_mesh(tilings[:1], 64).axis_sizes == (4, 16)


def test_manual_axes_of_partially_manual_sharding():
    text = "{devices=[1,1,4,16]<=[4,4,4]T(1,0,2) last_tile_dims={manual, replicated}}"
    assert hlo_sharding.manual_axes(text, MESH_444) == (1,)
    assert hlo_sharding.manual_axes("{manual}", MESH_444) == (0, 1, 2)
    assert hlo_sharding.manual_axes("{devices=[4,16]<=[64]}", MESH_444) == ()


@pytest.mark.parametrize("texts, devices, message", [
    (["{devices=[2,2]0,3,1,2}"], 4, "not a tiling of a mesh"),
    (["{devices=[2,3]<=[6]}", "{devices=[3,2]<=[6]}"], 6, "no one mesh has"),
    (["{devices=[2,2]<=[4]}"], 8, "over 4 devices in a program over 8"),
])
def test_tilings_no_mesh_makes_are_errors(texts, devices, message):
    with pytest.raises(ValueError, match=message):
        hlo_sharding.infer_mesh([hlo_sharding.parse(t) for t in texts], devices)


def test_tuple_sharding_is_unsupported():
    with pytest.raises(NotImplementedError, match="tuple sharding"):
        hlo_sharding.parse("{{replicated}, {manual}}")


@pytest.mark.parametrize("text", ["{unreduced}", "{devices=[2,1,2]<=[4] last_tile_dims={unreduced}}"])
def test_unreduced_shardings_are_refused_where_not_taken(text):
    """Both forms (all axes unreduced, or some in a subgroup) get the one error, which says
    what an unreduced value is and where jax-trn2 takes one."""
    with pytest.raises(NotImplementedError, match=r"takes unreduced values \(a different "
                       r"partial sum on each device.*only as the arguments and results"):
        hlo_sharding.parse(text)


@pytest.mark.parametrize("text, split, unreduced", [
    ("{unreduced}", None, (0, 1)),
    ("{devices=[2,2]<=[2,2]T(1,0) last_tile_dims={unreduced}}", ((1,),), (0,)),
    ("{devices=[1,2,2]<=[4] last_tile_dims={unreduced, replicated}}", ((),), (0,)),
    ("{devices=[2,2]<=[4]}", ((0,), (1,)), ()),
])
def test_unreduced_axes_of_a_partitioned_programs_parameters(text, split, unreduced):
    """A partitioned program's parameters and results: the dims' axes and the axes each
    device holds a partial sum along (jax's P('y', unreduced={'x'}) is the second)."""
    mesh = isa.MeshSpec(("x", "y"), (2, 2))
    tiling = hlo_sharding.parse(text, unreduced=True)
    assert (None if tiling is None else hlo_sharding.dim_axes(tiling, mesh)) == split
    assert hlo_sharding.unreduced_axes(text, mesh) == unreduced


@pytest.mark.parametrize("text, count, elements", [
    ("{{replicated}, {devices=[2]<=[2]}}", 2, ["{replicated}", "{devices=[2]<=[2]}"]),
    ("{devices=[2]<=[2]}", 3, ["{devices=[2]<=[2]}"] * 3),
    ("{{replicated}}", 0, []),  # XLA's sharding of an empty tuple (a function without results)
])
def test_elements_of_a_module_output_sharding(text, count, elements):
    assert hlo_sharding.elements(text, count) == elements


def test_elements_of_the_wrong_count_are_an_error():
    with pytest.raises(ValueError, match="2 elements for 3 values"):
        hlo_sharding.elements("{{replicated}, {replicated}}", 3)


@pytest.mark.parametrize("dim_axes, sizes, unreduced, text", [
    (((0,), ()), (2, 2), (), "{devices=[2,1,2]<=[4] last_tile_dim_replicate}"),
    # axes of size 1 tile nothing, but the device permutation takes every axis
    (((), (1,), ()), (1, 8, 1), (), "{devices=[1,8,1]<=[8]}"),
    (((1,),), (2, 2), (0,), "{devices=[2,2]<=[2,2]T(1,0) last_tile_dims={unreduced}}"),
    (((),), (2, 2), (0,), "{devices=[1,2,2]<=[4] last_tile_dims={unreduced, replicated}}"),
    ((), (2, 2, 2), (1,),
     "{devices=[2,4]<=[2,2,2]T(1,0,2) last_tile_dims={unreduced, replicated}}"),
    (((),), (2,), (0,), "{unreduced}"),
])
def test_a_layouts_sharding_is_as_xla_writes_it(dim_axes, sizes, unreduced, text):
    """As XLA writes them (its partitioner's own, for P('y', unreduced={'x'}) the third),
    and read back as the same layout."""
    sharding = hlo_sharding.of_layout(dim_axes, sizes, unreduced)
    assert str(sharding) == text
