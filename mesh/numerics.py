"""Trainium2 arithmetic: what precision each engine computes in, where it rounds, and how.

The model (sources in brackets; what is assumed is marked "assumed"):

- Data types: FP32, BF16, FP16 and the FP8 formats E4M3, E5M2 and E3M4 (jax's float8_e4m3fn,
  float8_e5m2, float8_e4m3, float8_e3m4), INT8, and the integer and boolean types StableHLO
  uses for indices and masks (mesh.dtypes) [AWS Neuron "Data Types" page].
- Tensor Engine (mesh.isa.kernels.matmul): products of BF16/FP16/FP8 inputs are exact (the
  product of two p-bit significands has at most 2p <= 22 bits, which FP32's 24 hold), unless
  a BF16 product leaves FP32's exponent range (BF16 shares it: over 2**128 or under 2**-149);
  each pass of up to 128 along the contraction (the PE array's rows) is summed in FP32;
  passes add into the PSUM tile in FP32 one after another, in pass order; the result is
  rounded once to the output type [nki.isa.nc_matmul: "the matmul accumulation and results
  are always in float32"; larger contractions accumulate several nc_matmul into one PSUM
  tile]. Assumed: the order of the additions inside one pass (on CPU executor devices
  the native loop's, mesh.isa.kernels.native; elsewhere XLA's FP32 dot, in any order
  within the pass: the error bound below covers all of them); FP32 inputs give
  FP32-rounded products (the "FP32 path", one more rounding per product). Integers
  accumulate exactly.
- Error bound of a dot product of length K (u = 2**-24, the FP32 unit roundoff; passes of
  P = min(K, 128); n = ceil(K / 128) passes): with h = (P - 1) + (n - 1) additions on any
  product's path to the result (plus 1 for FP32 inputs),
      |acc - exact| <= h*u / (1 - h*u) * sum_k |a_k b_k|
  and the output adds at most half an ulp of its type at acc (round-to-nearest).
- Vector/Scalar/GpSimd engines (mesh.isa.kernels.elementwise): elementwise and transcendental ops
  widen BF16/FP16/FP8 inputs to FP32, compute in FP32 and round once to the output type
  [NKI docs: the engines compute in FP32 internally]. Assumed: FP32 transcendentals are as
  accurate as XLA's CPU implementations.
- Reductions on one chip (mesh.isa.kernels.reduction) accumulate in FP32 and round once to
  the output type; a float sum or product is taken along each reduced dim (lowest first)
  in a fixed order, as a SIMD engine would: the K elements go to L = max(8, the smallest
  power of two from K / 32) lanes (element k to lane k mod L), each lane combines its
  ceil(K / L) <= 32 elements one after another, then lane i is combined with lane i + L/2,
  halving until one is left. So it does not depend on how the chips are split over
  executor devices. Assumed: the Vector engine's own order is not documented; this one
  keeps the bound above with h = ceil(K / L) - 1 + log2 L per reduced dim (at most
  31 + log2 L: 38 for K = 4096, where one sequence would have K - 1).
- Collectives (mesh.isa.kernels.collectives) accumulate on the collective engines in FP32, but
  each partial result travels between chips in the operand's type, so it is rounded to that
  type after every addition. The order is that of the algorithm: a ring reduces each chunk
  starting from the member after its owner and going around the ring (see that module).
  A reduction applies its reducer to the members' values alone, as StableHLO's all_reduce
  says (no identity is added in): a psum of -0s is -0, and a max or min with a NaN member is
  NaN, as `maximum`/`minimum` are. XLA's CPU collectives differ (a psum of -0s is +0; a
  max/min all-reduce skips NaN, so CPU JAX's jnp.max over a sharded axis holding a NaN returns
  the largest number, unlike the same jnp.max unsharded); this model keeps the spec.
- Rounding to a narrower float is round-to-nearest-even (RNE) by default; stochastic
  rounding (SR) is opt-in [AWS Neuron "Rounding Modes" page: RNE on all NeuronCores, SR
  selectable from NeuronCore-v2 on]. SR applies where the hardware rounds: an FP32 value
  converted to BF16, FP16 or an FP8 type (matmul outputs, engine outputs, `convert`,
  collective partials). Other conversions (to FP32 or wider, to integers) are unaffected.
- FP8 conversions (RNE) are exactly StableHLO's `convert` as XLA on CPU and ml_dtypes do
  them: float8_e4m3fn has no infinity, so values rounding beyond 448 (and +-inf) become NaN;
  float8_e5m2 (max 57344), float8_e4m3 (IEEE-style, max 240) and float8_e3m4 (max 15.5)
  overflow to +-inf; NaN stays NaN; values below the smallest normal round to subnormals,
  at or below half the smallest subnormal to (signed) zero. Assumed: Trainium2 converts by
  the same rules (its docs do not say; following StableHLO keeps agreement with CPU JAX).
  Note: CPU JAX rounds the FP32 result of an FP8-output dot via FP16 (its HLO converts
  f32 -> f16 -> f8), a double rounding that can land one ulp from this model's single one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

from mesh import dtypes, emulated_floats

ROUNDING_MODES = ("nearest", "stochastic")

# FP32 bit layout: 1 sign bit, 8 exponent bits (bias 127), 23 mantissa bits.
_FP32_MANTISSA_BITS = 23
_FP32_EXPONENT_BIAS = 127
_SIGN_BIT = 0x8000_0000
_MAGNITUDE_BITS = 0x7FFF_FFFF
_IMPLICIT_BIT = 1 << _FP32_MANTISSA_BITS
_RANDOM_BITS = 32  # random bits drawn per rounded element
_MAX_SEED = 2**32  # jax.random.key keeps 32 bits of the seed without jax_enable_x64


def compute_dtype(name: str) -> str:
    """The type an engine computes values of type `name` in."""
    return "float32" if name in dtypes.LOW_PRECISION_FLOATS else name


def widen(x: jnp.ndarray) -> jnp.ndarray:
    """x in its compute type (exact: every narrow float is an FP32 value)."""
    name = dtypes.dtype_name(x.dtype)
    wide = compute_dtype(name)
    return x if wide == name else lax.convert_element_type(x, dtypes.numpy_dtype(wide))


def round_to(x: jnp.ndarray, name: str, rounding=None) -> jnp.ndarray:
    """x rounded once to element type `name` (round-to-nearest-even unless `rounding` says)."""
    if rounding is not None:
        return rounding(x, name)
    if emulated_floats.is_emulated(name):
        return emulated_floats.round_to_format(x, name)
    target = dtypes.numpy_dtype(name)
    if x.dtype == target:
        return x
    return lax.convert_element_type(x, target)


@dataclass(frozen=True)
class Rounding:
    """How a program rounds to BF16/FP16/FP8: `mode` "nearest" (RNE) or "stochastic".

    Stochastic rounding draws its random bits from `seed`, the rounding site (each rounding
    in the program, numbered in program order when the program is compiled) and the element's
    position. They are fixed when the program is compiled: calling the same compiled program
    again with the same inputs reproduces its results exactly; another seed gives other bits.
    Values that are the same on several chips (replicated) are rounded with the same bits on
    each, so they stay the same. Inside bodies of loops and of reducers a site draws the same
    bits on every iteration.
    """

    mode: str = "nearest"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ROUNDING_MODES:
            raise ValueError(f"unknown rounding mode {self.mode!r}; the modes are "
                             f"{', '.join(repr(m) for m in ROUNDING_MODES)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) \
                or not 0 <= self.seed < _MAX_SEED:
            raise ValueError(f"rounding seed must be an integer in [0, 2**32), got {self.seed!r}")

    def rounder(self) -> Callable | None:
        """A fresh rounding hook for one trace of a program (None: round to nearest even)."""
        return StochasticRounder(int(self.seed)) if self.mode == "stochastic" else None

    def __str__(self) -> str:
        return self.mode if self.mode == "nearest" else f"{self.mode}(seed={self.seed})"


NEAREST = Rounding()


class StochasticRounder:
    """The `rounding(x, name)` hook of one traced program: stochastic rounding of FP32
    values to narrow floats, with the random bits of call number i (the i-th rounding site
    of the trace) drawn from fold_in(key(seed), i)."""

    def __init__(self, seed: int):
        self._key = jax.random.key(np.uint32(seed))
        self._sites = 0

    def __call__(self, x: jnp.ndarray, name: str) -> jnp.ndarray:
        if name not in dtypes.LOW_PRECISION_FLOATS or x.dtype != jnp.float32:
            return round_to(x, name)
        key = jax.random.fold_in(self._key, self._sites)
        self._sites += 1
        return stochastic_round(x, name, jax.random.bits(key, x.shape, jnp.uint32))


def stochastic_round(x: jnp.ndarray, name: str, random_bits: jnp.ndarray) -> jnp.ndarray:
    """FP32 `x` rounded to the narrow float type `name`, up or down with probabilities
    proportional to closeness (unbiased), using 32 uniform `random_bits` per element.

    The two candidates are the neighbours of |x| on the target's grid extended beyond its
    largest finite value (spacing 2**(max(e, emin) - mantissa bits) for |x| in [2**e,
    2**(e+1))), found in FP32's bits: below the target's smallest subnormal the candidates
    are 0 and that subnormal. |x| goes up with probability (|x| - down) / (up - down),
    exactly where that ratio has at most 32 bits (always, except for values below 2**-8 of
    the smallest subnormal: there it is resolved to 2**-32). The chosen FP32 value is then
    converted as StableHLO's convert does, which is exact on the grid and gives the format's
    own overflow beyond its largest finite value (inf, or NaN for float8_e4m3fn); NaN and
    inf inputs convert directly.
    """
    target = dtypes.numpy_dtype(name)
    info = ml_dtypes.finfo(target)
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    sign = bits & jnp.uint32(_SIGN_BIT)
    magnitude = bits & jnp.uint32(_MAGNITUDE_BITS)
    biased = (magnitude >> _FP32_MANTISSA_BITS).astype(jnp.int32)
    exponent = jnp.maximum(biased, 1) - _FP32_EXPONENT_BIAS  # FP32 subnormals: like 2**-126
    # FP32 mantissa bits below the target's last mantissa bit at this exponent.
    drop = (_FP32_MANTISSA_BITS - info.nmant) + jnp.maximum(0, info.minexp - exponent)

    # Within the target's range (drop <= 23) the grid is a bit mask on FP32's bits; adding
    # one step at the top of an FP32 binade carries into the exponent, as it should.
    in_grid = drop <= _FP32_MANTISSA_BITS
    mask = (jnp.uint32(1) << jnp.minimum(drop, _FP32_MANTISSA_BITS).astype(jnp.uint32)) - 1
    grid_down = magnitude & ~mask
    grid_up = grid_down + mask + 1
    # Below the smallest subnormal q: down is 0, up is q, and |x| / q = significand / 2**drop.
    smallest_subnormal = np.float32(info.smallest_subnormal).view(np.uint32)
    significand = (magnitude & jnp.uint32(_IMPLICIT_BIT - 1)) | \
        jnp.where(biased > 0, jnp.uint32(_IMPLICIT_BIT), jnp.uint32(0))
    down = jnp.where(in_grid, grid_down, jnp.uint32(0))
    up = jnp.where(in_grid, grid_up, jnp.uint32(smallest_subnormal))
    remainder = jnp.where(in_grid, magnitude & mask, significand)  # (|x| - down) in 2**-drop

    # Go up when random < remainder * 2**(32 - drop): probability remainder / 2**drop.
    shift_left = jnp.clip(_RANDOM_BITS - drop, 0, _RANDOM_BITS - 1).astype(jnp.uint32)
    shift_right = jnp.clip(drop - _RANDOM_BITS, 0, _RANDOM_BITS - 1).astype(jnp.uint32)
    threshold = jnp.where(drop <= _RANDOM_BITS, remainder << shift_left,
                          remainder >> shift_right)
    chosen = jnp.where(random_bits < threshold, up, down)
    rounded = lax.bitcast_convert_type(sign | chosen, jnp.float32)
    rounded = jnp.where(jnp.isfinite(x), rounded, x)
    return round_to(rounded, name)
