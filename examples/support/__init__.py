"""Support code the examples share, not examples themselves (they print nothing when run):

- `harness`: the CPU JAX reference mesh, the comparison with it, a step's cost summary;
- `decoder`: a MaxText-style decoder-only transformer (auto_sharding.py, plan_llama.py);
- `llama`: Llama inference (prefill, decode) tensor-parallel as NxD Inference lays it out
  (benchmarks/validate.py, serve_llama.py);
- `pipeline`: GPipe and 1F1B pipeline-parallel training steps in shard_map + ppermute
  (plan_pipeline.py).

An example imports them as `from support import harness` (its own folder is on sys.path).
"""
