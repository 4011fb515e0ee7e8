"""A program's content key: equal for programs that compute the same thing, whichever
lowering made them; different where an instruction, a constant or a source location
differs; a host callback's function stands for itself."""

import numpy as np

import lowering
from mesh import isa
from mesh.isa.content import program_key


def _module(constant: str = "1.0", location: str = "") -> str:
    loc = f' loc("{location}")' if location else ""
    return f"""
module @jit_f attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%arg0: tensor<3xf32>) -> (tensor<3xf32>) {{
    %c = stablehlo.constant dense<{constant}> : tensor<3xf32>
    %0 = stablehlo.add %arg0, %c : tensor<3xf32>{loc}
    return %0 : tensor<3xf32>
  }}
}}"""


def _lowered(text: str) -> isa.Program:
    return lowering.lower(lowering.parse_module(text))


def test_two_lowerings_of_one_module_have_one_key():
    first, second = _lowered(_module()), _lowered(_module())
    assert first is not second
    assert program_key(first) == program_key(second)


def test_a_different_constant_or_location_is_another_key():
    key = program_key(_lowered(_module()))
    assert program_key(_lowered(_module(constant="2.0"))) != key
    assert program_key(_lowered(_module(location="f.py:3:4"))) != key


def _callback_program(callback) -> isa.Program:
    value = isa.ValueInfo(isa.TensorType((3,), "float32"))
    call = isa.HostCallback((1,), (0,), callback=callback, kind="pure_callback",
                            has_side_effect=False)
    return isa.Program(isa.MeshSpec((), ()), (call,), (0,), (1,), {0: value, 1: value})


def test_a_host_callback_is_its_function():
    def double(x):
        return 2 * x

    def triple(x):
        return 3 * x

    key = program_key(_callback_program(double))
    assert key[1] == (double,)
    assert program_key(_callback_program(double)) == key
    assert program_key(_callback_program(triple)) != key


def test_arrays_differ_by_type_and_shape_as_well_as_bytes():
    def constant(value: np.ndarray) -> isa.Program:
        info = isa.ValueInfo(isa.TensorType(value.shape, str(value.dtype)))
        return isa.Program(isa.MeshSpec((), ()), (isa.Constant((0,), (), value=value),),
                           (), (0,), {0: info})

    zeros = np.zeros(4, np.int32)
    keys = {program_key(constant(v)) for v in
            (zeros, zeros.view(np.float32), zeros.reshape(2, 2), np.zeros(4, np.int32))}
    assert len(keys) == 3
