"""The kernels the chip runs fused: composites (`stablehlo.composite`) by these names are one
kernel whose engines work on SBUF-resident tiles, not their decomposition's instructions.

The cost model costs each by its own rule (mesh.perf.attention), mesh.memory counts none of
its intermediates, and lowering keeps each composite whole through XLA's partitioner
(lowering.partition).
"""

from __future__ import annotations

from mesh import isa
from mesh.isa.control import Composite

# jax_trn2.flash_attention's forward and backward kernels (NKI's flash attention)
FLASH_ATTENTION = "jax_trn2.flash_attention"
FLASH_ATTENTION_GRAD = "jax_trn2.flash_attention_grad"

FUSED_KERNELS = frozenset({FLASH_ATTENTION, FLASH_ATTENTION_GRAD})


def is_fused_kernel(instr: isa.Instruction) -> bool:
    """Whether `instr` is a composite the chip runs as one fused kernel."""
    return isinstance(instr, Composite) and instr.name in FUSED_KERNELS
