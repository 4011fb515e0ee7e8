"""jax_trn2.jit, the front door with the simulator's own options (a machine per function,
executor devices, global host arrays), under JAX's transformations; meshes placed on the
torus; attention kernels for users."""
