"""The compile core both front doors call: StableHLO in, a loaded executable out
(executable), the simulated devices and their buffers, the machine a mesh was made for,
the options of a machine and of a program, the names the platform goes by, how jax lowers
for it, and the picture of a step. It imports neither door."""
