"""The native kernel's build (mesh/isa/kernels/pass_matmul.cc, an XLA FFI handler), against
the FFI headers jaxlib ships; everything else is in pyproject.toml."""

import importlib.util
import os

from setuptools import Extension, setup


def jaxlib_include() -> str:
    """jaxlib's C++ headers (xla/ffi/api), found without importing jaxlib."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("building jax-trn2 needs jaxlib (pyproject.toml's build requirements)")
    return os.path.join(spec.submodule_search_locations[0], "include")


setup(ext_modules=[Extension("mesh.isa.kernels._pass_matmul",
                             sources=["mesh/isa/kernels/pass_matmul.cc"],
                             include_dirs=[jaxlib_include()],
                             extra_compile_args=["-O3", "-std=c++17"],
                             language="c++")])
