"""The compiled parts of jax-trn2, built at install time with the system's compilers:
the PJRT plugin's C entry point, the native matmul pass loop and the reduce's fixed-order
float sums (XLA FFI handlers, built against the FFI headers jaxlib ships). Everything else
is in pyproject.toml."""

import importlib.util
import os

from setuptools import Extension, setup


def jaxlib_include() -> str:
    """jaxlib's C++ headers (xla/ffi/api), found without importing jaxlib."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("building jax-trn2 needs jaxlib (pyproject.toml's build requirements)")
    return os.path.join(spec.submodule_search_locations[0], "include")


# the FFI handlers: built against jaxlib's FFI headers, with no FMA contraction (their sums
# and products are rounded where they say)
FFI_HANDLER = dict(include_dirs=[jaxlib_include()],
                   depends=["mesh/isa/kernels/parallel_for.h"],
                   extra_compile_args=["-O3", "-std=c++17", "-ffp-contract=off"],
                   language="c++")

setup(ext_modules=[
    # GetPjrtApi, which hands jaxlib the table jax_trn2.plugin fills; no Python headers
    Extension("jax_trn2.plugin._shim", sources=["jax_trn2/plugin/_shim.c"],
              libraries=["m"]),  # fegetenv/fesetenv
    # the matmul pass loop (mesh/isa/kernels/native.py loads it)
    Extension("mesh.isa.kernels._pass_matmul", sources=["mesh/isa/kernels/pass_matmul.cc"],
              **FFI_HANDLER),
    # the reduce's float sums and products in their fixed order (native.py loads it too)
    Extension("mesh.isa.kernels._fixed_order_reduce",
              sources=["mesh/isa/kernels/fixed_order_reduce.cc"], **FFI_HANDLER),
])
