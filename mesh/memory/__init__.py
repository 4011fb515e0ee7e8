"""HBM accounting: which buffers each chip holds over a step, the peak, and what fills it
(liveness.py: the model; analysis.py: per-chip figures with jax's field names)."""

from mesh.memory.analysis import (MemoryAnalysis, MemoryStats, OutOfHBMError, bytes_bound,
                                  describe, peak_split_text)
from mesh.memory.liveness import Buffer, Liveness, PeakSplit, liveness

__all__ = ["Buffer", "Liveness", "MemoryAnalysis", "MemoryStats", "OutOfHBMError", "PeakSplit",
           "bytes_bound", "describe", "liveness", "peak_split_text"]
