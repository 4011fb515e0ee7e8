"""A lower bound of a step's peak HBM per device, read from the per-device program XLA's
SPMD partitioner makes of it (lowering.partitioned_module), before it is lowered,
scheduled and costed: what a search needs to prune a layout that cannot fit at the price
of partitioning alone.

The bound counts real per-device sizes, as the partitioner split them: a scan's stacked
activations (the residuals a jax.grad keeps for its backward pass) come out split over
the batch axes and wherever their shardings say, not over every device. It follows the
rules of mesh.memory.liveness (the planned peak), counting only buffers those rules must
hold, so it never exceeds the planned peak:

- every argument is resident when the step starts (one in host memory is not counted);
- while a top-level loop of main runs (a jax.lax.scan or fori_loop: XLA makes each a
  `stablehlo.while`), these are live at once: the arguments not donated (they live the
  whole step); the donated arguments an op after the loop reads; the results of earlier
  loops an op after the loop reads (a forward scan's stacked residuals, during the
  backward one); the loop's operands its body reads and passes through unchanged (a
  scan's stacked inputs: weights, residuals) and the state it writes that is read after
  it (its stacked outputs, its carries). Ops the results do not need are left out (dead
  code is no buffer).

Each is counted once by the buffer it may be stored in: a value reached through a view
or a single-operand op that may be one (a reshape, slice, convert, ...) counts as its
source, at the least size along the way; a loop's state it writes counts as the buffer of
its initial value (the loop may write in place there), unless that is a constant (a
stacked output's zeros: the state is then a buffer of its own). Values of other ops are
not counted (a chain of elementwise ops may be kept on chip), nor what a loop's body needs
beyond its state.
"""

from __future__ import annotations

from typing import Any, Iterator

from jaxlib.mlir import ir

from lowering import mlir, partition

# Ops whose result may be stored in its (single) operand's buffer, or kept on chip while
# that operand is held: a value reached through them counts as the operand's buffer.
_MAY_SHARE = frozenset({"stablehlo.reshape", "stablehlo.bitcast_convert",
                        "stablehlo.broadcast_in_dim", "stablehlo.slice",
                        "stablehlo.dynamic_slice", "stablehlo.transpose", "stablehlo.convert",
                        "stablehlo.copy"})
_BARRIER = "stablehlo.optimization_barrier"  # result i is operand i
_HOST_KINDS = ("pinned_host", "unpinned_host")
_WHILE = "stablehlo.while"


def least_resident_bytes(module: ir.Module) -> int:
    """The least peak HBM per device of a per-device program (a partitioned module, see
    the module's docstring): the larger of its arguments' bytes and, at each top-level
    loop of main, the bytes of the distinct buffers live while it runs."""
    return _Program(partition.main_function(module)).least_peak()


class _Program:
    """main's top-level ops that its results need (what a compiler keeps), and which of
    them read each value."""

    def __init__(self, main: Any):
        block = main.regions[0].blocks[0]
        self.ops = _needed([op.operation for op in block.operations])
        self.arguments = list(block.arguments)
        attrs = mlir.Attributes(main).get("arg_attrs", ())
        entries = [a if isinstance(a, dict) else {} for a in attrs] + \
            [{}] * (len(self.arguments) - len(attrs))
        self.on_host = {a for a, e in zip(self.arguments, entries)
                        if str(e.get(partition.MEMORY_KIND_ATTR, "")).strip('"') in _HOST_KINDS}
        self.donated = {a for a, e in zip(self.arguments, entries)
                        if any(name in e for name in ("tf.aliasing_output", "jax.buffer_donor"))}
        # value -> position of the last top-level op reading it (len(ops): returned)
        self.last_read: dict[Any, int] = {}
        for k, op in enumerate(self.ops):
            for value in _operands_within(op):
                self.last_read[value] = k

    def least_peak(self) -> int:
        least = sum(_bytes(a) for a in self.arguments if a not in self.on_host)
        for k, op in enumerate(self.ops):
            if op.name == _WHILE:
                least = max(least, sum(self._live_at_loop(k).values()))
        return least

    def _live_at_loop(self, k: int) -> dict[Any, int]:
        """The buffers live while loop ops[k] runs: buffer -> its least bytes."""
        live: dict[Any, int] = {}

        def add(buffer: Any, nbytes: int) -> None:
            if buffer is not None:
                live[buffer] = max(live.get(buffer, 0), nbytes)

        for a in self.arguments:
            if a not in self.on_host and (a not in self.donated or self.last_read.get(a, -1) > k):
                add(a, _bytes(a))
        for op in self.ops[:k]:
            if op.name == _WHILE:
                for result in op.results:
                    if self.last_read.get(result, -1) > k:
                        add(*self._buffer(result))
        loop = self.ops[k]
        for slot, result in enumerate(loop.results):
            if self.last_read.get(result, -1) > k or \
                    _passes_through(loop, slot) and _read_by_body(loop, slot):
                add(*self._buffer(result))
        return live

    def _buffer(self, value: Any) -> tuple[Any, int]:
        """(the buffer `value` may be stored in, the least bytes that buffer has), or
        (None, 0) for a value that may take no HBM of its own (built of constants, or by an
        op whose result may stay on chip)."""
        nbytes = _bytes(value)
        while True:
            op = _producer(value)
            if op is None:
                return (None, 0) if value in self.on_host else (value, nbytes)
            if op.name in _MAY_SHARE:
                value = op.operands[0]
            elif op.name == _BARRIER:
                value = op.operands[_result_index(op, value)]
            elif op.name == _WHILE:
                slot = _result_index(op, value)
                initial = op.operands[slot]
                source, _ = self._buffer(initial)
                if _passes_through(op, slot) or source is not None:
                    value = initial  # the loop may write its state in place there
                else:
                    return value, nbytes  # state of its own, its initial value a constant
            else:  # a constant, or a value that may stay on chip
                return None, 0
            nbytes = min(nbytes, _bytes(value))


def _needed(ops: list[Any]) -> list[Any]:
    """The ops of a block that its terminator needs, or that have no results (effects),
    in order: dead code is no buffer."""
    needed, kept = set(), []
    for op in reversed(ops):
        if op is ops[-1] or not len(op.results) or any(r in needed for r in op.results):
            kept.append(op)
            needed.update(_operands_within(op))
    return kept[::-1]


def _producer(value: Any) -> Any:
    """The op that makes `value`; None for a block argument."""
    owner = value.owner
    return owner.operation if isinstance(owner, ir.OpView) else \
        owner if isinstance(owner, ir.Operation) else None


def _result_index(op: Any, value: Any) -> int:
    return next(i for i, r in enumerate(op.results) if r == value)


def _passes_through(loop: Any, slot: int) -> bool:
    """Whether a while loop's body yields its state `slot` unchanged (a scan's stacked
    inputs, read-only: the result is the operand's buffer)."""
    body = loop.regions[1].blocks[0]
    returned = list(body.operations)[-1].operation.operands
    return returned[slot] == body.arguments[slot]


def _read_by_body(loop: Any, slot: int) -> bool:
    """Whether a while loop's body reads its state `slot` other than to yield it."""
    body = loop.regions[1].blocks[0]
    terminator = list(body.operations)[-1].operation
    return any(use.owner.operation != terminator for use in body.arguments[slot].uses)


def _operands_within(op: Any) -> Iterator[Any]:
    """The operands of `op` and of every op nested in its regions."""
    yield from op.operands
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield from _operands_within(inner.operation)


def _bytes(value: Any) -> int:
    type_ = mlir.value_type(value.type)
    return sum(t.nbytes for t in (type_.leaves() if isinstance(type_, mlir.TupleType)
                                  else (type_,)))
