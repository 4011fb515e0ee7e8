"""Independent all-reduces of a per-chip program combined into one variadic all-reduce.

XLA's compilers combine the all-reduces the SPMD partitioner inserts (one per gradient, say)
when none depends on another: one collective launch instead of several, each launch paying
the collective's fixed cost (synchronisation, DMA set-up). XLA:CPU runs AllReduceCombiner
as its pass `cpu-all-reduce-combiner`, XLA:GPU as `all-reduce-combiner`; Neuron's compiler,
which receives XLA's HLO after such passes, also coalesces collectives of a group into one
(its 2.30 release notes: grouped reduce-scatters handled as one). jax-trn2 takes XLA's
module right after partitioning (lowering.partition), before that pass: XLA:CPU runs its
combiner after layout assignment, algebraic simplification and fusion, whose module is no
longer the partitioner's (fusions, changed layouts, other numerics), and jaxlib has no way
to run one XLA pass alone. So the combining is done here, on the StableHLO module, with
XLA's rules:

- all-reduces of one block (XLA: one computation) with the same replica groups, channel
  kind, use_global_device_ids and reduction are combined; also the same element type (XLA
  combines f32 with bf16, but a StableHLO all-reduce has one reduction body, of one type);
- none of a combined set depends on another (nor on what another's result feeds);
- a combined all-reduce moves at most COMBINE_THRESHOLD_BYTES, COMBINE_THRESHOLD_COUNT
  operands (XLA:GPU's default xla_gpu_all_reduce_combine_threshold_bytes, and the count
  every XLA backend passes its combiner).

The combined all-reduce takes the place of the last one of its set; the ops between that
read an earlier one's result move after it, in their order. An op that reads a result and
may not move (another all-reduce, an op with side effects: a host callback, a token) ends
the set before it. Each operand is reduced as it was alone: the values do not change.
"""

from __future__ import annotations

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from lowering import mlir

COMBINE_THRESHOLD_BYTES = 30 * 1024 * 1024
COMBINE_THRESHOLD_COUNT = 256
_ALL_REDUCE = "stablehlo.all_reduce"


def combine_all_reduces(module: ir.Module) -> None:
    """Combine the independent all-reduces of every block of `module` (in place)."""
    for op in module.body.operations:
        _combine_in_regions(op.operation)


def _combine_in_regions(operation) -> None:
    for region in operation.regions:
        for block in region.blocks:
            _combine_in_block(block)


class _Set:
    """All-reduces to combine, and the ops after the first that read their results."""

    def __init__(self, first) -> None:
        self.members = [first]
        self.readers: list = []  # ops reading a member's result (or a reader's), in order
        self.tainted = set(first.results)  # values computed from a member's result
        self.count = len(first.operands)
        self.nbytes = _operand_bytes(first)

    def admits(self, op) -> bool:
        return self.count + len(op.operands) <= COMBINE_THRESHOLD_COUNT and \
            self.nbytes + _operand_bytes(op) <= COMBINE_THRESHOLD_BYTES

    def add(self, op) -> None:
        self.members.append(op)
        self.tainted.update(op.results)
        self.count += len(op.operands)
        self.nbytes += _operand_bytes(op)


def _combine_in_block(block) -> None:
    open_sets: dict[tuple, _Set] = {}  # by the all-reduces' key
    closed: list[_Set] = []
    for op in list(block.operations):
        op = op.operation
        _combine_in_regions(op)
        key = _key(op) if op.name == _ALL_REDUCE else None
        used = _values_read(op)
        for set_key, s in list(open_sets.items()):
            if not used & s.tainted:
                continue
            if key is not None or _has_side_effects(op):  # it would have to move: the set
                closed.append(open_sets.pop(set_key))     # ends before it
            else:
                s.readers.append(op)
                s.tainted.update(op.results)
        if key is None:
            continue
        current = open_sets.get(key)
        if current is not None and current.admits(op):
            current.add(op)
        else:
            if current is not None:
                closed.append(current)
            open_sets[key] = _Set(op)
    for s in closed + list(open_sets.values()):
        if len(s.members) > 1:
            with s.members[0].location:
                _merge(s)


def _merge(s: _Set) -> None:
    """Replace the set's all-reduces by one at the last one's place."""
    first, last = s.members[0], s.members[-1]
    operands = [v for member in s.members for v in member.operands]
    result_types = [r.type for member in s.members for r in member.results]
    attributes = {name: first.attributes[name] for name in first.attributes}
    combined = ir.Operation.create(_ALL_REDUCE, results=result_types, operands=operands,
                                   attributes=attributes, regions=1, ip=ir.InsertionPoint(last))
    _copy_region(first.regions[0], combined.regions[0])
    results = iter(combined.results)
    for member in s.members:
        for old in member.results:
            old.replace_all_uses_with(next(results))
    anchor = combined
    for reader in s.readers:
        if reader.is_before_in_block(combined):
            reader.move_after(anchor)
            anchor = reader
    for member in s.members:
        member.erase()


def _copy_region(source, target) -> None:
    """Copy a single-block region (the reduction) into the empty region `target`."""
    (block,) = source.blocks
    copy = target.blocks.append(*[a.type for a in block.arguments])
    mapping = dict(zip(block.arguments, copy.arguments))
    for op in block.operations:
        cloned = op.operation.clone(ip=ir.InsertionPoint(copy))
        for i, operand in enumerate(cloned.operands):
            if operand in mapping:
                cloned.operands[i] = mapping[operand]
        mapping.update(zip(op.operation.results, cloned.results))


def _key(op) -> tuple:
    """What all-reduces must share to be combined: replica groups, channel kind, whether
    the groups name global device ids, the reduction and the element type."""
    attrs = op.attributes
    channel_kind = hlo.ChannelHandle(attrs["channel_handle"]).channel_type \
        if "channel_handle" in attrs else None
    element_types = {str(ir.ShapedType(v.type).element_type) for v in op.operands}
    return (str(attrs["replica_groups"]), channel_kind,
            "use_global_device_ids" in attrs, _reduction_text(op.regions[0]),
            tuple(sorted(element_types)))


def _reduction_text(region) -> tuple:
    """The reduction body, independent of value names: each op's name, attributes,
    result types and operands (block argument or op positions; a value from outside the
    body as itself)."""
    (block,) = region.blocks
    positions = {a: ("arg", i) for i, a in enumerate(block.arguments)}
    text = []
    for n, op in enumerate(block.operations):
        op = op.operation
        attributes = tuple(sorted((name, str(op.attributes[name])) for name in op.attributes))
        text.append((op.name, attributes, tuple(str(r.type) for r in op.results),
                     tuple(positions.get(v, v) for v in op.operands)))
        positions.update({r: ("op", n, i) for i, r in enumerate(op.results)})
    return tuple(text)


def _operand_bytes(op) -> int:
    return sum(mlir.tensor_type(v.type).nbytes for v in op.operands)


def _values_read(operation) -> set:
    """The values an op reads, its regions' ops included."""
    values = set(operation.operands)
    for region in operation.regions:
        for block in region.blocks:
            for op in block.operations:
                values |= _values_read(op.operation)
    return values


def _has_side_effects(operation) -> bool:
    """A custom call with side effects (a host callback), an op on tokens (infeed,
    outfeed, send, recv), or an op holding one."""
    attrs = operation.attributes
    if operation.name == "stablehlo.custom_call" and "has_side_effect" in attrs and \
            ir.BoolAttr(attrs["has_side_effect"]).value:
        return True
    if any(mlir.is_token(v.type) for v in [*operation.operands, *operation.results]):
        return True
    return any(_has_side_effects(op.operation) for region in operation.regions
               for block in region.blocks for op in block.operations)
