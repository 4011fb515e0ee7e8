"""Layouts of a step for planning: a mesh of named parallelism axes, how the program's
logical axes map onto it, the rematerialisation policy and the machine.

    layout = Layout.of(dp=4, fsdp=4, tp=4, remat="full")       # 64 chips of trn2-ultra
    mesh = layout.make_mesh()                                    # ('dp', 'fsdp', 'tp')
    w = layout.sharding(mesh, "embed", "mlp")                    # P('fsdp', 'tp')
    Layout.of(tp=4, fsdp=16, topology="trn2.48xlarge")          # 64 devices: 16 chips x 4

A layout counts devices, what JAX sees: a chip on the whole-chip presets (trn2,
trn2-ultra, ...), a logical NeuronCore on the machines as AWS rents them (trn2.48xlarge:
16 chips x 4 at LNC=2, each device 24 GiB). Its mesh axes go outermost first in
`MESH_ORDER`, whatever order they were given in, because make_mesh puts a mesh's innermost
axes on the cores of a chip (mesh.machine.place_mesh) and the outer ones over the chips'
torus: tp takes a chip's devices first (TP inside a chip, as AWS advises for Trn2), then
cp, ep and fsdp the chips, dp and pp outermost (the chips' part of a mesh is laid on the
torus by place_mesh's rules: on an UltraCluster an axis as long as its UltraServers takes
the EFA axis between them).

Mesh axes are named for the parallelism they carry, and logical axes (MaxText's names for the
dims of parameters and activations) go to mesh axes by `DEFAULT_RULES` unless a layout
says otherwise:

- dp    data parallel: the batch is split, everything else replicated;
- fsdp  fully sharded data parallel: the batch and the parameters' `embed` dim are split
        (the partitioner gathers weights before use and scatters their gradients);
- tp    tensor parallel (Megatron): attention heads, MLP units and the vocabulary split;
- pp    pipeline parallel: the `stages` dim of stacked stage weights split;
- ep    expert parallel: the `experts` dim split (tokens are routed to them);
- cp    context (sequence) parallel: the sequence `length` dim of activations split.

A layout is data: the step function that applies it (shardings, remat, microbatches) is
the user's, built for each layout by the function given to jax_trn2.plan.sweep.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_trn2.core.platform import DEFAULT_TOPOLOGY
from jax_trn2.frontend.meshes import make_mesh
from mesh.machine import Topology, get_topology

KINDS = ("dp", "fsdp", "tp", "pp", "ep", "cp")
# The parallelism axes in mesh order, outermost first: the heaviest traffic (tp's per-layer
# all-reduces) innermost, on the fastest links (a chip's cores, then its torus neighbours),
# the lightest (dp's one gradient reduction a step, pp's activations between stages)
# outermost. A layout with axes of other names keeps the order it was given.
MESH_ORDER = ("dp", "pp", "fsdp", "ep", "cp", "tp")

# Logical axis -> the mesh axes (in this order) that split it, where the layout has them;
# () for a dim never split. The names are MaxText's (its configs/base.yml
# logical_axis_rules, its mesh axes read as data -> dp, fsdp -> fsdp, tensor -> tp,
# stage -> pp, expert -> ep, sequence and context -> cp) and Flax's examples' (lm1b:
# batch, length, embed, heads, kv, mlp, vocab; T5X's joined_kv), each mapped as MaxText
# maps it, except that a parameter's `embed` is split by fsdp alone.
_BATCH, _TENSOR = ("dp", "fsdp", "ep"), ("tp",)
DEFAULT_RULES: dict[str, tuple[str, ...]] = {
    # parameters
    "embed": ("fsdp",), "embed_no_exp": ("fsdp",), "q_lora": ("fsdp",), "kv_lora": ("fsdp",),
    "heads": _TENSOR, "q_heads": _TENSOR, "kv_heads": _TENSOR, "joined_kv": _TENSOR,
    "mlp": _TENSOR, "vocab": _TENSOR, "norm": _TENSOR,
    "kv": (), "kv_head_dim": (),  # a head's own dim
    "stages": ("pp",), "layers": ("pp",),
    "experts": ("ep",), "exp": ("ep",),
    # activations
    "batch": _BATCH, "activation_batch": _BATCH, "activation_kv_batch": _BATCH,
    "activation_prefill_kv_batch": _BATCH, "decode_batch": _BATCH,
    "activation_embed_and_logits_batch": ("dp", "pp", "fsdp", "ep"),
    "length": ("cp",), "seq": ("cp",), "sequence": ("cp",), "activation_length": ("cp",),
    "activation_q_length": ("cp",), "activation_norm_length": ("cp",),
    "decode_length": ("cp",), "activation_kv_length": (),
    "activation_embed": _TENSOR, "activation_heads": _TENSOR, "activation_kv_heads": _TENSOR,
    "activation_kv": _TENSOR, "activation_kv_head_dim": _TENSOR, "activation_mlp": _TENSOR,
    "activation_vocab": _TENSOR, "activation_stage": ("pp",), "activation_exp": ("ep",),
    # a serving KV cache: MaxText splits only its heads
    "cache_heads": _TENSOR, "cache_batch": (), "cache_batch_prefill": (), "cache_kv": (),
    "cache_sequence": (),
}


class UnknownLogicalAxisError(ValueError):
    """A logical axis that a layout's rules do not map to mesh axes (`axis`): every layout
    with the same rules fails on it, so a sweep raises it once rather than planning on."""

    def __init__(self, message: str, axis: str):
        super().__init__(message, axis)
        self.axis = axis

    def __str__(self) -> str:
        return self.args[0]


@dataclass(frozen=True)
class Layout:
    """One way to run a step: mesh axes (name, size; ordered by MESH_ORDER when every name
    is one of its kinds), the rematerialisation policy
    the step should apply (None: none; a name the step's builder understands, e.g.
    "full"), the machine, logical-axis rules, and for a pipeline its microbatch count (to
    show the bubble formula beside the measured bubble) and schedule."""

    axes: tuple[tuple[str, int], ...]
    remat: str | None = None
    topology: str | Topology = DEFAULT_TOPOLOGY
    # (logical axis, mesh axes) pairs: a tuple, so that layouts can key dicts
    rules: tuple[tuple[str, tuple[str, ...]], ...] = tuple(DEFAULT_RULES.items())
    microbatches: int | None = None
    schedule: str | None = None  # a pipeline schedule the step's builder knows ("1f1b")
    label: str = ""  # the name shown in tables; by default made from the axes and remat
    # the logical axes each PartitionSpec `spec` gave was asked for (spec entries -> the
    # logical-axis tuples), so that an error about a split dimension can name the
    # logical axis ('tp=8 does not divide heads (12)'); not part of the layout's identity
    asked: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        names = [name for name, _ in self.axes]
        if not names:
            raise ValueError("Layout: give at least one mesh axis, e.g. Layout.of(fsdp=64)")
        if len(set(names)) != len(names):
            raise ValueError(f"Layout: mesh axis names repeat: {names}")
        for name, size in self.axes:
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"Layout: axis {name!r} has size {size!r}; sizes are "
                                 "positive ints")
        if self.microbatches is not None and self.microbatches < 1:
            raise ValueError(f"Layout: microbatches must be >= 1, got {self.microbatches}")
        if set(names) <= set(MESH_ORDER):
            object.__setattr__(self, "axes", tuple(sorted(
                self.axes, key=lambda axis: MESH_ORDER.index(axis[0]))))

    @classmethod
    def of(cls, *, remat: str | None = None, topology: str | Topology = DEFAULT_TOPOLOGY,
           rules: Mapping[str, Sequence[str]] | None = None, microbatches: int | None = None,
           schedule: str | None = None, label: str = "", **axes: int) -> Layout:
        """A layout from mesh axis sizes by name: `Layout.of(dp=2, tp=8)`.
        `rules` override DEFAULT_RULES for the logical axes they name."""
        merged = dict(DEFAULT_RULES)
        merged.update({k: (v,) if isinstance(v, str) else tuple(v)
                       for k, v in (rules or {}).items()})
        return cls(tuple(axes.items()), remat, topology, tuple(merged.items()), microbatches,
                   schedule, label)

    @property
    def name(self) -> str:
        """'dp 4 x fsdp 4 x tp 4, remat full' (axes of size 1 left out), 'pp 4, 1f1b, 8
        microbatches', or the label."""
        if self.label:
            return self.label
        split = [f"{n} {s}" for n, s in self.axes if s > 1] or [f"{self.axes[0][0]} 1"]
        parts = [" x ".join(split)] + ([self.schedule] if self.schedule else []) + (
            [f"{self.microbatches} microbatches"] if self.microbatches else []) + (
            [f"remat {self.remat}"] if self.remat else [])
        return ", ".join(parts)

    @property
    def machine(self) -> Topology:
        """The layout's topology (a preset by name, or the Topology given)."""
        return self.topology if isinstance(self.topology, Topology) else \
            get_topology(self.topology)

    @property
    def topology_name(self) -> str:
        """The name of the layout's topology."""
        return self.machine.name

    @property
    def devices(self) -> int:
        """Devices the layout's mesh takes (chips, or logical NeuronCores on the instance
        presets): the product of its axis sizes."""
        return math.prod(size for _, size in self.axes)

    @property
    def chips(self) -> int:
        """Chips the layout's devices occupy (a chip rented whole even when the mesh uses
        only some of its cores): what chip-hours count."""
        return -(-self.devices // self.machine.devices_per_chip)

    @property
    def placement_error(self) -> str | None:
        """Why the layout's mesh cannot be placed on its machine, naming the axes at fault
        ('fsdp=32 needs 32 devices; trn2 has 16'); None when it can. A layout is data, so
        one the machine cannot hold is still a layout: a sweep marks it."""
        have = self.machine.num_devices
        if self.devices <= have:
            return None
        axes = " x ".join(f"{n}={s}" for n, s in self.axes if s > 1)
        return f"{axes} needs {self.devices} devices; {self.machine.name} has {have}"

    def size(self, axis: str) -> int:
        """The size of mesh axis `axis` (1 when the layout has none)."""
        return dict(self.axes).get(axis, 1)

    def make_mesh(self) -> Mesh:
        """The layout's mesh on its topology (jax_trn2.make_mesh), its axes in the layout's
        order (MESH_ORDER: tp innermost, on the cores of a chip on the instance presets),
        or an error when the machine cannot hold it. Pass the same topology
        to jax_trn2.jit (topology=layout.topology), as make_mesh remembers only one machine
        per mesh shape and names."""
        if self.placement_error:
            raise ValueError(f"Layout {self.name}: {self.placement_error}")
        return make_mesh(tuple(s for _, s in self.axes), tuple(n for n, _ in self.axes),
                         topology=self.topology)

    def spec(self, *logical: str | None) -> P:
        """The PartitionSpec of a value whose dims have these logical axes (None: a dim
        never split): each dim split over the layout's mesh axes its rule names, in the
        rule's order; a mesh axis already splitting an earlier dim is left out (a value
        cannot be split twice over one axis)."""
        present = {name for name, _ in self.axes}
        rules = dict(self.rules)
        used: set[str] = set()
        entries = []
        for axis in logical:
            if axis is not None and axis not in rules:
                raise UnknownLogicalAxisError(
                    f"Layout {self.name}: no rule for logical axis {axis!r}; known: "
                    f"{sorted(rules)} (add one with rules=...)", axis)
            mesh_axes = [a for a in rules.get(axis, ()) if a in present and a not in used]
            used.update(mesh_axes)
            entries.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1
                           else tuple(mesh_axes))
        while entries and entries[-1] is None:
            entries.pop()
        self.asked.setdefault(tuple(entries), set()).add(tuple(logical))
        return P(*entries)

    def logical_axis(self, spec: Sequence[Any], dim: int, rank: int) -> str | None:
        """The logical axis of dimension `dim` of a rank-`rank` value split as `spec` (its
        entries), when every value `spec()` gave that spec with that rank names the same
        one; None when none did or they differ (e.g. heads and mlp both split by tp)."""
        names = {axes[dim] for axes in self.asked.get(tuple(spec), ())
                 if len(axes) == rank and axes[dim] is not None}
        return names.pop() if len(names) == 1 else None

    def sharding(self, mesh: Mesh, *logical: str | None) -> NamedSharding:
        """NamedSharding of a value with these logical axes on `mesh` (see `spec`)."""
        return NamedSharding(mesh, self.spec(*logical))

    def shardings(self, mesh: Mesh, logical_axes: Any) -> Any:
        """NamedShardings for a pytree of logical-axis tuples (leaves: tuples of str/None)."""
        return jax.tree.map(lambda axes: self.sharding(mesh, *axes), logical_axes,
                            is_leaf=lambda x: isinstance(x, tuple))


def grid(devices: int, kinds: Sequence[str] = ("dp", "fsdp", "tp"),
         remats: Iterable[str | None] = (None,),
         topologies: Iterable[str | Topology] = (DEFAULT_TOPOLOGY,),
         limits: Mapping[str, int] | None = None, **options: Any) -> list[Layout]:
    """Every layout of `devices` devices (chips on the whole-chip presets, logical
    NeuronCores on the instance presets: 64 on a trn2.48xlarge) over the mesh axes `kinds`
    (each size a divisor, their product `devices`; sizes above `limits[kind]` left out),
    for every remat policy and topology. `options` go to Layout.of (rules, microbatches).
    Layouts a topology cannot hold are kept: a sweep marks them (Layout.placement_error)."""
    if devices < 1:
        raise ValueError(f"grid: devices must be >= 1, got {devices}")
    unknown = [k for k in (limits or {}) if k not in kinds]
    if unknown:
        raise ValueError(f"grid: limits name {unknown}, which are not among kinds {tuple(kinds)}")
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    layouts = []
    for sizes in itertools.product(divisors, repeat=len(kinds)):
        if math.prod(sizes) != devices or any(
                s > (limits or {}).get(k, devices) for k, s in zip(kinds, sizes)):
            continue
        for topology in topologies:
            for remat in remats:
                layouts.append(Layout.of(remat=remat, topology=topology, **options,
                                         **dict(zip(kinds, sizes))))
    return layouts
