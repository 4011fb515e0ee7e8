"""lowering/rules/callbacks.py: host callbacks, found by the index in their backend
config among the Python functions jax keeps beside the module."""

import jax
import numpy as np
import pytest

from lowering import LoweringError, UnsupportedOpError
from mesh import isa
from rule_lowering import lower_jax, lower_text, only


def print_twice(x):
    jax.debug.print("{x}", x=x)
    return x * 2


def callback_text(backend_config: str) -> str:
    return f"""func.func public @main(%x: tensor<2xf32>) -> tensor<2xf32> {{
      %y = stablehlo.custom_call @xla_ffi_python_cpu_callback(%x)
          {{has_side_effect = true{backend_config}}} : (tensor<2xf32>) -> tensor<2xf32>
      return %y : tensor<2xf32>
    }}"""


def test_callback_is_the_function_its_index_names():
    def first(x):
        return x

    def second(x):
        return x

    program = lower_text(callback_text(", mhlo.backend_config = {index = 1 : ui64}"),
                         host_callbacks=[first, second])
    callback = only(program, isa.HostCallback)
    assert callback.callback is second
    assert callback.has_side_effect
    assert callback.ins == program.inputs and callback.outs == program.outputs


def test_debug_print_is_named_from_the_ops_scope():
    def cpu_callback(*args):
        return ()

    program = lower_jax(print_twice, np.ones(2, np.float32), host_callbacks=[cpu_callback])
    callback = only(program, isa.HostCallback)
    assert (callback.callback, callback.kind) == (cpu_callback, "jax.debug.print")


def test_callback_without_its_python_function_is_unsupported():
    with pytest.raises(UnsupportedOpError, match="(?s)jax.debug.print needs its Python "
                                                 r"function.*\(stablehlo.custom_call\)"):
        lower_jax(print_twice, np.ones(2, np.float32))


def test_callback_without_an_index_is_an_error():
    with pytest.raises(LoweringError, match="(?s)backend config names no callback index"
                                            r".*\(stablehlo.custom_call\)"):
        lower_text(callback_text(""), host_callbacks=[print])
