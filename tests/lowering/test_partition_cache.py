"""lowering.partition_cache: XLA's partitioned modules kept beside jax's persistent
compilation cache, so that another process lowers the program without XLA."""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import lowering
from lowering import partition, partition_cache, stopped_compile, xla_log
from mesh.isa.printer import program_text


@pytest.fixture
def kept_in(tmp_path, monkeypatch):
    """Entries kept in tmp_path (jax's own cache is left as it is), and nothing in
    partition's memory of this process."""
    monkeypatch.setattr(partition_cache, "directory", lambda: str(tmp_path))
    monkeypatch.setattr(partition, "_PARTITIONED", {})
    return tmp_path


def in_another_process():
    """Forget what this process partitioned, as a new process starts."""
    partition._PARTITIONED.clear()


def sharded_program(rows: int = 16) -> str:
    """A jit with NamedShardings over 8 CPU devices: XLA's partitioner splits it."""
    mesh = jax.make_mesh((8,), ("i",), devices=jax.devices("cpu")[:8])
    f = jax.jit(lambda x, w: jnp.tanh(x @ w), in_shardings=(
        NamedSharding(mesh, P("i")), NamedSharding(mesh, P(None, "i"))))
    return f.lower(np.ones((rows, 32), np.float32), np.ones((32, 64), np.float32)).as_text()


def test_a_kept_partitioning_is_read_instead_of_running_xla(kept_in, monkeypatch):
    text = sharded_program()
    first = lowering.lower(text)
    stopped_compile.wait_for_running()  # (an entry is written once XLA's compile ends)
    assert len(os.listdir(kept_in)) == 1
    reported = []
    monkeypatch.setattr(partition, "_partition", lambda *a: pytest.fail("XLA ran again"))
    monkeypatch.setattr(xla_log, "report", reported.append)
    in_another_process()
    again = lowering.lower(text)
    assert program_text(again) == program_text(first)
    assert reported == [[]]  # XLA's log, replayed (this program's is empty)


# The one kind of XLA log line kept (lowering.xla_log holds it back to warn about it).
REMAT = ("W0000 spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization. The "
         "compiler cannot go from sharding {replicated} to {devices=[8]<=[8]} efficiently "
         "for HLO operation %dot.3 = f32[16,8]{1,0} dot(%a, %b)")


def test_the_log_is_kept_with_the_module(kept_in, monkeypatch):
    text = sharded_program()
    real = partition._partition

    def logging_partition(module, num_devices):
        os.write(2, f"{REMAT}\n".encode())
        return real(module, num_devices)

    monkeypatch.setattr(partition, "_partition", logging_partition)
    reported = []
    monkeypatch.setattr(xla_log, "report", reported.append)
    lowering.lower(text)
    stopped_compile.wait_for_running()
    monkeypatch.setattr(partition, "_partition", lambda *a: pytest.fail("XLA ran again"))
    in_another_process()
    lowering.lower(text)
    assert reported == [[REMAT]] * 2  # the warning XLA gave is given again


def test_another_program_or_chip_count_is_another_entry(kept_in):
    for rows in (16, 32):
        partition.partition(lowering.parse_module(sharded_program(rows)), 8)
    stopped_compile.wait_for_running()  # (an entry is written once XLA's compile ends)
    assert len(os.listdir(kept_in)) == 2
    assert partition_cache.key(b"a", 8) != partition_cache.key(b"a", 16)


def test_without_jax_persistent_cache_nothing_is_kept():
    saved = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert partition_cache.directory() is None
        partition_cache.write("name", b"data")  # nowhere: no error
        assert partition_cache.read("name") is None
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)


def test_the_directory_is_under_jax_cache_when_it_is_local(tmp_path):
    saved = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        assert partition_cache.directory() == str(tmp_path / partition_cache.SUBDIRECTORY)
        jax.config.update("jax_compilation_cache_dir", "gs://bucket/cache")
        assert partition_cache.directory() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)


def test_a_directory_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setattr(partition_cache, "directory", lambda: str(blocked))
    with pytest.warns(UserWarning, match="could not keep a partitioned module"):
        partition_cache.write("name", b"data")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert partition_cache.read("name") is None


@pytest.mark.parametrize("damage", [b"", b"\x0a\xff\xff\xff", b"\x0a\x03abc"])
def test_a_damaged_entry_is_partitioned_again_and_rewritten(kept_in, damage):
    text = sharded_program()
    first = program_text(lowering.lower(text))
    stopped_compile.wait_for_running()
    (name,) = os.listdir(kept_in)
    (kept_in / name).write_bytes(damage)
    in_another_process()
    assert program_text(lowering.lower(text)) == first
    stopped_compile.wait_for_running()
    assert (kept_in / name).read_bytes() != damage  # written anew
