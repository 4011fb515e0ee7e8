"""Test-wide setup: 64 CPU host devices for the JAX reference runs.

The config must be set before any JAX backend starts, so it is done at import of the
root conftest, before test modules import jax_trn2 or use jax.
"""

import jax
import numpy as np
import pytest

jax.config.update("jax_num_cpu_devices", 64)


@pytest.fixture
def rng():
    """A seeded generator: test data is the same on every run."""
    return np.random.default_rng(0)


@pytest.fixture
def gspmd():
    """jax without Shardy (jax_use_shardy_partitioner=False): shardings as GSPMD's
    mhlo.sharding custom calls, for the tests of that path."""
    shardy = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    yield
    jax.config.update("jax_use_shardy_partitioner", shardy)
