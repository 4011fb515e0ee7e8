// The Vector engine's float sum or product along one dim in its fixed order (the simulator's
// reduce, mesh/isa/kernels/reduction.py), for the host CPU: one XLA FFI handler,
// FixedOrderReduce, called from the executor's jitted program.
//
// The operand is read as [outer, n, inner] (the reduced dim of n in the middle), BF16 or
// FP32, and the result written as FP32 [outer, inner]. Along the reduced dim, element k goes
// to lane k % L of L = max(8, the smallest power of two from n / 32) lanes; each lane
// combines its elements one after another (a lane with none holds the identity: -0 for a
// sum, 1 for a product), then lane i is combined with lane i + L/2, halving until one is
// left. Every step is one FP32 operation on two values in that order, whatever the vector
// width the compiler picks (the build turns off FMA contraction), so the bits are those of
// reduction.py's XLA path (_along_lanes) on every CPU. BF16 is widened exactly (its bits
// are FP32's top 16) as it is read: no FP32 copy of the operand is made, where XLA:CPU
// makes one for a BF16 slice.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxRun = 32;   // elements a lane combines in sequence, at most
constexpr int64_t kMinLanes = 8;  // lanes, at least
// Columns of a lane combined in registers at a time (eight AVX-512 vectors of FP32)
constexpr int64_t kStrip = 128;
// The lanes' results for a block of inner columns take at most this many bytes (L2 holds
// them), and a work item covers about this many operand elements or more (fewer items:
// less scheduling; a small reduce runs on the calling thread alone).
constexpr int64_t kLaneBytes = 64 << 10;
constexpr int64_t kItemElements = 1 << 16;

// The loops in the widest vectors the CPU has (each element's operations are the same in
// any width)
#if defined(__x86_64__) && defined(__linux__)  // (clones are picked by an ifunc)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif
// for the helpers of those loops: compiled into each clone
#define ALWAYS_INLINE inline __attribute__((always_inline))

int64_t Lanes(int64_t n) {
  int64_t lanes = kMinLanes;
  while (lanes * kMaxRun < n) lanes *= 2;
  return lanes;
}

ALWAYS_INLINE float Widen(float x) { return x; }
ALWAYS_INLINE float Widen(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

template <bool kProduct>
ALWAYS_INLINE float Combine(float a, float b) {
  return kProduct ? a * b : a + b;
}

template <bool kProduct>
constexpr float kIdentity = kProduct ? 1.0f : -0.0f;  // x + -0 and x * 1 are x

// Combines lane i + half into lane i, i < half, for half = lanes / 2 .. 1, each lane
// `width` values of acc (lane l at acc + l * width); the result is lane 0's.
template <bool kProduct>
ALWAYS_INLINE void Tree(float* acc, int64_t lanes, int64_t width) {
  for (int64_t half = lanes / 2; half >= 1; half /= 2) {
    for (int64_t i = 0; i < half * width; ++i) {
      acc[i] = Combine<kProduct>(acc[i], acc[i + half * width]);
    }
  }
}

// Lane `l`'s rows l, l + L, ... (< n) of a slab (its rows `inner` apart), from column
// `column`, `width` columns (kWidth where it is known when compiled: then in registers, else
// at most kStrip), combined one row after another into lane[0 .. width).
template <typename T, bool kProduct, int64_t kWidth>
ALWAYS_INLINE void CombineLane(const T* slab, int64_t l, int64_t lanes, int64_t n,
                               int64_t inner, int64_t column, int64_t width, float* lane) {
  const int64_t w = kWidth ? kWidth : width;
  float r[kWidth ? kWidth : kStrip];
  const T* first = slab + l * inner + column;
  for (int64_t c = 0; c < w; ++c) r[c] = Widen(first[c]);
  for (int64_t k = l + lanes; k < n; k += lanes) {
    const T* row = slab + k * inner + column;
    for (int64_t c = 0; c < w; ++c) r[c] = Combine<kProduct>(r[c], Widen(row[c]));
  }
  std::copy(r, r + w, lane);
}

// Columns [0, width) of one [n, inner] slab into out: each lane's rows combined into its
// row of acc[L][width], a strip of columns at a time, then the tree across the lanes.
template <typename T, bool kProduct>
VECTOR_CLONES void ReduceColumns(const T* slab, int64_t n, int64_t inner, int64_t width,
                                 float* acc, float* out) {
  const int64_t lanes = Lanes(n), filled = std::min(lanes, n);
  for (int64_t l = 0; l < filled; ++l) {
    float* lane = acc + l * width;
    int64_t c0 = 0;
    for (; c0 + kStrip <= width; c0 += kStrip) {
      CombineLane<T, kProduct, kStrip>(slab, l, lanes, n, inner, c0, kStrip, lane + c0);
    }
    if (c0 < width) {
      CombineLane<T, kProduct, 0>(slab, l, lanes, n, inner, c0, width - c0, lane + c0);
    }
  }
  std::fill(acc + filled * width, acc + lanes * width, kIdentity<kProduct>);
  Tree<kProduct>(acc, lanes, width);
  std::copy(acc, acc + width, out);
}

// `rows` rows of n (an inner of 1) into out[0 .. rows): in each row the lanes are runs of L
// consecutive elements, combined into acc elementwise. kLanes: L where it is known when
// compiled (then acc lives in registers), else 0 (acc is `scratch`).
template <typename T, bool kProduct, int64_t kLanes>
VECTOR_CLONES void ReduceRows(const T* x, int64_t rows, int64_t n, float* scratch,
                              float* out) {
  const int64_t lanes = kLanes ? kLanes : Lanes(n), filled = std::min(lanes, n);
  float fixed[kLanes ? kLanes : 1];
  float* acc = kLanes ? fixed : scratch;
  for (int64_t o = 0; o < rows; ++o) {
    const T* row = x + o * n;
    for (int64_t l = 0; l < filled; ++l) acc[l] = Widen(row[l]);
    for (int64_t l = filled; l < lanes; ++l) acc[l] = kIdentity<kProduct>;
    int64_t start = lanes;
    for (; start + lanes <= n; start += lanes) {  // whole runs
      for (int64_t l = 0; l < lanes; ++l) {
        acc[l] = Combine<kProduct>(acc[l], Widen(row[start + l]));
      }
    }
    for (int64_t l = 0; start + l < n; ++l) {  // the last run's part
      acc[l] = Combine<kProduct>(acc[l], Widen(row[start + l]));
    }
    Tree<kProduct>(acc, lanes, 1);
    out[o] = acc[0];
  }
}

template <typename T, bool kProduct>
void ReduceRowsOfAnyLanes(const T* x, int64_t rows, int64_t n, float* scratch, float* out) {
  switch (Lanes(n)) {
    case 8: return ReduceRows<T, kProduct, 8>(x, rows, n, scratch, out);
    case 16: return ReduceRows<T, kProduct, 16>(x, rows, n, scratch, out);
    case 32: return ReduceRows<T, kProduct, 32>(x, rows, n, scratch, out);
    case 64: return ReduceRows<T, kProduct, 64>(x, rows, n, scratch, out);
    case 128: return ReduceRows<T, kProduct, 128>(x, rows, n, scratch, out);
    default: return ReduceRows<T, kProduct, 0>(x, rows, n, scratch, out);
  }
}

template <typename T, bool kProduct>
void Reduce(ffi::ThreadPool& pool, const T* x, float* out, int64_t outer, int64_t n,
            int64_t inner) {
  const int64_t lanes = Lanes(n);
  if (inner == 1) {  // rows of n: a work item takes whole rows
    const int64_t rows = std::max<int64_t>(1, kItemElements / n);
    ParallelFor(pool, (outer + rows - 1) / rows, [&](int64_t item) {
      thread_local std::vector<float> scratch;
      scratch.resize(lanes);
      const int64_t first = item * rows;
      ReduceRowsOfAnyLanes<T, kProduct>(x + first * n, std::min(rows, outer - first), n,
                                        scratch.data(), out + first);
    });
    return;
  }
  // blocks of columns of each [n, inner] slab, as wide as the lanes' bytes allow; a work
  // item takes `per_item` blocks in a row
  const int64_t width = std::min(inner, std::max<int64_t>(
      kStrip, kLaneBytes / static_cast<int64_t>(sizeof(float)) / lanes));
  const int64_t blocks = (inner + width - 1) / width, total = outer * blocks;
  const int64_t per_item = std::max<int64_t>(1, kItemElements / (n * width));
  ParallelFor(pool, (total + per_item - 1) / per_item, [&](int64_t item) {
    thread_local std::vector<float> acc;
    acc.resize(lanes * width);
    for (int64_t b = item * per_item; b < std::min(total, (item + 1) * per_item); ++b) {
      const int64_t o = b / blocks, first = b % blocks * width;
      ReduceColumns<T, kProduct>(x + o * n * inner + first, n, inner,
                                 std::min(width, inner - first), acc.data(),
                                 out + o * inner + first);
    }
  });
}

template <bool kProduct>
ffi::Error ReduceOf(ffi::ThreadPool& pool, ffi::AnyBuffer x, float* out, int64_t outer,
                    int64_t n, int64_t inner) {
  if (x.element_type() == ffi::BF16) {
    Reduce<uint16_t, kProduct>(pool, static_cast<const uint16_t*>(x.untyped_data()), out,
                               outer, n, inner);
  } else if (x.element_type() == ffi::F32) {
    Reduce<float, kProduct>(pool, static_cast<const float*>(x.untyped_data()), out, outer,
                            n, inner);
  } else {
    return ffi::Error::InvalidArgument("FixedOrderReduce: a BF16 or FP32 operand");
  }
  return ffi::Error::Success();
}

ffi::Error FixedOrderReduceImpl(ffi::ThreadPool pool, ffi::AnyBuffer x,
                                ffi::Result<ffi::Buffer<ffi::F32>> out, int64_t outer,
                                int64_t n, int64_t inner, bool product) {
  if (outer < 0 || n < 1 || inner < 0 ||
      static_cast<int64_t>(x.element_count()) != outer * n * inner ||
      static_cast<int64_t>(out->element_count()) != outer * inner) {
    return ffi::Error::InvalidArgument(
        "FixedOrderReduce: an operand of outer * n * inner elements (n >= 1) and a result "
        "of outer * inner");
  }
  if (outer * inner == 0) return ffi::Error::Success();
  float* result = out->typed_data();
  return product ? ReduceOf<true>(pool, x, result, outer, n, inner)
                 : ReduceOf<false>(pool, x, result, outer, n, inner);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(FixedOrderReduce, FixedOrderReduceImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()         // the operand
                                  .Ret<ffi::Buffer<ffi::F32>>()  // the result
                                  .Attr<int64_t>("outer")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("inner")
                                  .Attr<bool>("product"));
