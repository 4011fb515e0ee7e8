"""Meshes of the same devices in different orders: jax moves an array between them with a
program over an sdy.mesh that lists its device ids, which the plugin has XLA's partitioner
place, as XLA:CPU does."""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def _moved(devices, spec_from, spec_to):
    """An array put on a (2, 2) mesh of `devices`, moved onto the mesh of the same devices
    reversed (under a transfer guard that refuses the caller's own transfers), then
    doubled by a next program: each device's (index, piece) of both."""
    first = Mesh(np.array(devices[:4]).reshape(2, 2), ("x", "y"))
    reversed_ = Mesh(np.array(devices[:4][::-1]).reshape(2, 2), ("x", "y"))
    x = jax.device_put(np.arange(16, dtype=np.int32).reshape(8, 2),
                       NamedSharding(first, spec_from))
    with jax.transfer_guard("disallow_explicit"):
        moved = jax.device_put(x, NamedSharding(reversed_, spec_to))
    assert moved.sharding == NamedSharding(reversed_, spec_to)
    doubled = jax.jit(lambda v: v * 2)(moved)
    return [{s.device.id: (s.index, np.asarray(s.data).tolist())
             for s in out.addressable_shards} for out in (moved, doubled)]


@pytest.mark.parametrize("spec_from,spec_to", [(P("x", "y"), P("x")), (P("x"), P("y")),
                                               (P(None, "y"), P())])
def test_device_put_to_a_mesh_of_the_same_devices_reversed(spec_from, spec_to):
    ours = _moved(jax.devices("trn2"), spec_from, spec_to)
    assert ours == _moved(jax.devices("cpu"), spec_from, spec_to)
    moved, doubled = ({d: piece for d, (_, piece) in pieces.items()} for pieces in ours)
    assert all(np.array_equal(np.asarray(moved[d]) * 2, doubled[d]) for d in moved)
