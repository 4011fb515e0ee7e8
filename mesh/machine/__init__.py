"""The machine description: the Trainium2 chip, the torus of chips, and where a logical mesh
sits on it."""

from mesh.machine.chip import ChipSpec
from mesh.machine.runtime import RuntimeSpec
from mesh.machine.placement import (Placement, chips_text, device_order, place_first,
                                    place_mesh, place_mesh_within, place_on)
from mesh.machine.topology import (DEFAULT_LNC, INSTANCE_NAMES, TOPOLOGY_NAMES,
                                   ULTRACLUSTER_PREFIX, ULTRASERVER_CLUSTER_PREFIX, Link,
                                   Topology, get_topology, ultracluster)

__all__ = ["DEFAULT_LNC", "INSTANCE_NAMES", "ULTRASERVER_CLUSTER_PREFIX", "ChipSpec", "Link", "Placement", "RuntimeSpec", "TOPOLOGY_NAMES", "Topology", "ULTRACLUSTER_PREFIX",
           "chips_text", "device_order", "get_topology", "place_first", "place_mesh",
           "place_mesh_within", "place_on", "ultracluster"]
