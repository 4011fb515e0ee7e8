"""The performance model: what each instruction costs (Tensor Engine tiling, collectives on
the torus, engine ops), one chip's schedule of them, and the timeline as a trace."""

from mesh.perf import attention  # noqa: E402,F401  (registers the fused kernels' cost rules)
