"""jax_trn2.planner.resident: the least peak of a per-device program, by hand, and never
above the peak mesh.memory plans for it."""

import pytest

from jax_trn2.core.executable import LoadedExecutable
from jax_trn2.planner.resident import least_resident_bytes
from lowering.mlir import parse_module

# A loop that passes a donated w (f32[256], 1 KiB) through, reading it, and a donated
# spare (f32[512], 2 KiB) through, not reading it, and stacks w into acc (f32[8, 256],
# 8 KiB, from zeros: a state of its own), as a scan stacks its per-step outputs.
LOOP = """
module @m {
  func.func public @main(%w0: tensor<256xf32> {tf.aliasing_output = 0 : i32},
                         %spare0: tensor<512xf32> {jax.buffer_donor = true})
      -> (tensor<256xf32>, tensor<8x256xf32>) {
    %c0 = stablehlo.constant dense<0> : tensor<i32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %zeros = stablehlo.broadcast_in_dim %z, dims = [] : (tensor<f32>) -> tensor<8x256xf32>
    %r:4 = stablehlo.while(%i = %c0, %w = %w0, %spare = %spare0, %acc = %zeros)
        : tensor<i32>, tensor<256xf32>, tensor<512xf32>, tensor<8x256xf32>
      cond {
        %c8 = stablehlo.constant dense<8> : tensor<i32>
        %lt = stablehlo.compare LT, %i, %c8 : (tensor<i32>, tensor<i32>) -> tensor<i1>
        stablehlo.return %lt : tensor<i1>
      } do {
        %one = stablehlo.constant dense<1> : tensor<i32>
        %next = stablehlo.add %i, %one : tensor<i32>
        %row = stablehlo.reshape %w : (tensor<256xf32>) -> tensor<1x256xf32>
        %c00 = stablehlo.constant dense<0> : tensor<i32>
        %upd = stablehlo.dynamic_update_slice %acc, %row, %i, %c00
            : (tensor<8x256xf32>, tensor<1x256xf32>, tensor<i32>, tensor<i32>) -> tensor<8x256xf32>
        stablehlo.return %next, %w, %spare, %upd
            : tensor<i32>, tensor<256xf32>, tensor<512xf32>, tensor<8x256xf32>
      }
    %s = stablehlo.multiply %r#1, %AFTER : tensor<256xf32>
    return %s, %r#3 : tensor<256xf32>, tensor<8x256xf32>
  }
}"""
SPARE_READ_AFTER = "%h = stablehlo.slice %spare0 [0:256] : (tensor<512xf32>) -> tensor<256xf32>"


@pytest.mark.parametrize("read_after, least", [
    (False, 1024 + 8192),  # w (read by the body) and acc; spare is read by no one
    (True, 1024 + 2048 + 8192),  # spare is read after the loop: held through it
])
def test_the_least_peak_of_a_loop_by_hand(read_after, least):
    after = "%h" if read_after else "%r#1"
    text = LOOP.replace("%AFTER", after)
    if read_after:
        text = text.replace("    %s = ", f"    {SPARE_READ_AFTER}\n    %s = ")
    assert least_resident_bytes(parse_module(text)) == least
    planned = LoadedExecutable.from_stablehlo("trn2", text).memory_analysis()
    assert least <= planned.peak_memory_in_bytes
