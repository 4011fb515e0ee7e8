"""The jax-trn2 command line: `jax-trn2 inspect | compare | plan` (jax_trn2.cli.commands)."""

from jax_trn2.cli.commands import main  # noqa: F401
