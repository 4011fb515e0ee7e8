"""`python -m jax_trn2 ...`: the jax-trn2 command line (jax_trn2.cli)."""

from jax_trn2.cli import main

raise SystemExit(main())
