"""What a run or a program says to a person: the numerics comparison with CPU JAX, and a
program compiled by either door as jax_trn2 studies it (jax_trn2.inspect)."""
