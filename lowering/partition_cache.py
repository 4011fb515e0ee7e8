"""XLA's partitioned modules kept on disk beside jax's persistent compilation cache.

Partitioning a module runs XLA's compiler up to its SPMD partitioner (lowering.partition):
0.1-0.2 s for a small program, about a second of CPU time for a large training step. jax's
persistent compilation cache keeps compiled executables from one process to the next (a
notebook restart); where a user has turned it on (`jax_compilation_cache_dir`, a local
directory), the per-chip module XLA made of a program is kept in its subdirectory
`jax_trn2_partitioned`, so that the next process lowers the program without partitioning it
again. Entries are named by a hash of what determines them: the module's bytecode, the chip
count, jaxlib's version and XLA_FLAGS.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings

import jax
import jaxlib

SUBDIRECTORY = "jax_trn2_partitioned"
# Changes when what an entry holds changes: its fields, or what lowering.partition does to
# XLA's module before keeping it
_FORMAT = b"jax-trn2 partitioned module 2"


def key(module_bytecode: bytes, num_devices: int) -> str:
    """The entry name of a module's partitioning for `num_devices` chips (by jaxlib's
    version and the XLA_FLAGS XLA reads, as they may change what it makes)."""
    digest = hashlib.sha256(_FORMAT)
    for part in (jaxlib.__version__.encode(), os.environ.get("XLA_FLAGS", "").encode(),
                 str(num_devices).encode(), module_bytecode):
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


def directory() -> str | None:
    """Where entries are kept: under jax's persistent compilation cache when it is on and
    a local directory; else None (nothing is kept)."""
    base = jax.config.jax_compilation_cache_dir
    if not jax.config.jax_enable_compilation_cache or not base or "://" in base:
        return None
    return os.path.join(base, SUBDIRECTORY)


def read(name: str) -> bytes | None:
    """The entry `name`, or None."""
    where = directory()
    if where is None:
        return None
    try:
        with open(os.path.join(where, name), "rb") as f:
            return f.read()
    except OSError:
        return None


def write(name: str, data: bytes, where: str | None = None) -> None:
    """Keep `data` as entry `name` in `where` (default: `directory()`; whole or not at all:
    written aside, then renamed). A directory that cannot be written to is warned of, not
    an error: the program compiles all the same."""
    where = where or directory()
    if where is None:
        return
    aside = None
    try:
        os.makedirs(where, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".", delete=False) as f:
            aside = f.name
            f.write(data)
        os.replace(aside, os.path.join(where, name))
    except OSError as e:
        if aside is not None and os.path.exists(aside):
            os.unlink(aside)
        warnings.warn(f"jax-trn2 could not keep a partitioned module in {where}: {e}",
                      stacklevel=2)
