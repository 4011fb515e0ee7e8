// The Tensor Engine's matmul as the simulator models it (mesh/isa/kernels/matmul.py), for
// the host CPU: out[b] = sum over passes p of (lhs[b][:, pass p] @ rhs[b][pass p, :]),
// each pass summed in FP32 and the passes added in order into an FP32 accumulator.
//
// One XLA FFI handler, PassMatmul, called from the executor's jitted program, reading the
// operands and writing the result where the executor holds them (offset tables, made from
// the sizes and strides of the dims it is given), in one array or in parts (one per chip:
// each chip's piece a buffer of its own), as its FP32 sums or as those rounded to BF16 (as
// XLA:CPU rounds them, each tile once its passes are done, as PSUM is copied out: no FP32
// result goes through memory). A pass of
// BF16 operands is a chain of VDPBF16PS from +0.0 over the pass's pairs of contraction
// elements: exactly the sums of the executor's XLA loop (one host GEMM per pass, XLA:CPU's
// YNNPACK BF16 kernel, then an FP32 add) on a CPU with AVX-512 BF16. A pass of FP32 operands
// is a chain of FMAs from +0.0 in contraction order, as a column of the PE array sums its
// products: the same for every shape of matrix, where XLA:CPU's FP32 GEMMs sum in an order
// that depends on the matrix's shape. Where the values live differs from the XLA loop: a
// tile of the result stays in registers and L1 for all its passes, where XLA writes each
// pass's product to memory and reads it back to add it.
//
// The same arithmetic runs on every CPU: the AVX-512 code on an x86-64 CPU that has the
// instructions it uses (FP32: AVX-512F; BF16: AVX-512F, BW and BF16), and otherwise (or when
// the call asks for it) a portable path of plain C++ over the same packed panels that
// performs the same FP32 operations in the same order, VDPBF16PS emulated as an AMD Zen 4
// computes it (DotBf16): the results are the same bits on any host, but for which NaN a
// sum of two NaNs gives (the order in which the compiler hands an add its operands). (The
// build turns off FMA contraction: the portable path's products and sums are rounded
// where it says.)

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "parallel_for.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

extern "C" int Avx512(int bf16);  // below

namespace {

constexpr int64_t kTileRows = 8;     // rows of a register tile
constexpr int64_t kTileCols = 32;    // columns of a register tile: two 16-lane vectors
constexpr int64_t kBlockBytes = 256 << 10;  // a block of lhs rows kept in L2 over the panels
// Every block of lhs rows goes over a group of about this many bytes of rhs panels before
// the next group, which then stays in L3 (32 MiB, shared with other processes) where all
// of a wide rhs may not: one thread's FP32 2048x1024 @ 1024x2048 ran at 94 GFLOP per CPU
// second, from 87 with each block going over all 8 MiB of panels (best of 6 runs each, on
// a 2-core AMD EPYC with AVX-512 BF16 that another session shared)
constexpr int64_t kGroupBytes = 2 << 20;
// Batch elements per thread from which the threads take whole ones rather than share each
constexpr int64_t kBatchesPerThread = 4;

// Where each element of an operand or of the result is, as offsets in elements that add:
// element (b, m, k) of lhs is at batch[b] + row[m] + k (its contraction is contiguous),
// element (b, k, n) of rhs at batch[b] + k_offsets[k] + col[n], element (b, m, n) of the
// result at batch[b] + row[m] + col[n]. Any layout the executor holds an array in, whose
// dims are split into batch, row (or contraction) and column dims, is such a sum.
struct Offsets {
  const int64_t* batch;
  const int64_t* row;  // rhs: the contraction's
  const int64_t* col;  // lhs: none
};

// rhs[k][n] of one batch element.
template <typename T>
struct Rhs {
  const T* data;  // at the batch element
  const Offsets& at;
  int64_t k, n;
  T operator()(int64_t kk, int64_t nn) const { return data[at.row[kk] + at.col[nn]]; }
};

// Whether the `cols` columns a table gives are contiguous (one vector load or store).
bool Contiguous(const int64_t* col, int64_t cols) {
  for (int64_t c = 1; c < cols; ++c) {
    if (col[c] != col[0] + c) return false;
  }
  return true;
}

// Packs the columns [n0, n0 + 32) of rhs for the BF16 kernels: for each pass, its pairs of
// contraction elements, each pair as 32 columns of (even, odd) BF16 values; columns past
// the end and the odd element of a pass of odd length are zero.
void PackBf16(const Rhs<uint16_t>& rhs, int64_t n0, int64_t pass, uint16_t* out) {
  const int64_t cols = std::min(kTileCols, rhs.n - n0);
  for (int64_t k0 = 0; k0 < rhs.k; k0 += pass) {
    const int64_t len = std::min(pass, rhs.k - k0);
    for (int64_t p = 0; p < (len + 1) / 2; ++p, out += 2 * kTileCols) {
      const int64_t even = k0 + 2 * p, odd = even + 1;
      const bool has_odd = 2 * p + 1 < len;
      for (int64_t c = 0; c < kTileCols; ++c) {
        out[2 * c] = c < cols ? rhs(even, n0 + c) : 0;
        out[2 * c + 1] = c < cols && has_odd ? rhs(odd, n0 + c) : 0;
      }
    }
  }
}

// Packs the columns [n0, n0 + 32) of rhs for the FP32 kernels: row after row of 32 columns.
void PackF32(const Rhs<float>& rhs, int64_t n0, int64_t /*pass*/, float* out) {
  const int64_t cols = std::min(kTileCols, rhs.n - n0);
  const bool contiguous = Contiguous(rhs.at.col + n0, cols);
  for (int64_t kk = 0; kk < rhs.k; ++kk, out += kTileCols) {
    if (contiguous) {
      std::memcpy(out, rhs.data + rhs.at.row[kk] + rhs.at.col[n0], cols * sizeof(float));
    } else {
      for (int64_t c = 0; c < cols; ++c) out[c] = rhs(kk, n0 + c);
    }
    std::fill(out + cols, out + kTileCols, 0.0f);
  }
}

// A result tile's columns: `cols` (at most 32) of them, the result's offsets `at`, at
// out_row + col[c] for each of its rows, where out_row is where the row's first column is
// (the one of the smallest offset); loaded and stored as two vectors where they are
// contiguous.
struct TileCols {
  int64_t col[kTileCols];
  int64_t cols;
  int64_t first, span;  // the smallest offset, and how far beyond it the largest is
  bool contiguous;
  uint16_t m0, m1;  // AVX-512 masks of the columns in the first and second 16

  TileCols(const int64_t* at, int64_t cols) : cols(cols) {
    const auto [low, high] = std::minmax_element(at, at + cols);
    first = *low;
    span = *high - *low;
    for (int64_t c = 0; c < cols; ++c) col[c] = at[c] - first;
    contiguous = Contiguous(col, cols);
    m0 = cols >= 16 ? 0xFFFF : (1u << cols) - 1;
    m1 = cols >= 32 ? 0xFFFF : cols <= 16 ? 0 : (1u << (cols - 16)) - 1;
  }

  // The pass's sums added to the row's earlier passes (unless it is the first), stored.
  void Accumulate(float* out_row, const float* sums, bool first) const {
    for (int64_t c = 0; c < cols; ++c) {
      float* o = out_row + col[c];
      *o = first ? sums[c] : *o + sums[c];  // PSUM: the pass is added to the passes before it
    }
  }
};

// The columns of a tile of sums held apart from the result (Run's, for a BF16 result):
// contiguous, from 0.
constexpr int64_t kScratchCols[kTileCols] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10,
                                             11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                             22, 23, 24, 25, 26, 27, 28, 29, 30, 31};

// The columns of a tile of sums held apart for a result tile's columns `cols`: its passes
// are added as they would be in the result (as vectors where its columns are contiguous,
// else one by one), since which NaN a sum of two NaNs keeps depends on the order the
// compiler hands the add its operands.
TileCols ScratchOf(const TileCols& cols) {
  TileCols scratch(kScratchCols, cols.cols);
  scratch.contiguous = cols.contiguous;
  return scratch;
}

// FP32 x rounded to BF16 as XLA:CPU converts it (bit for bit, checked over every FP32
// value by benchmarks/bf16_rounding.py): to nearest even, a subnormal too and a value past
// BF16's largest to infinity; a NaN to the quiet NaN of its sign, with no payload.
inline uint16_t ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7FFFFFFF) > 0x7F800000) return ((bits >> 16) & 0x8000) | 0x7FC0;
  return static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// A row of a tile's FP32 sums (`sums`, columns contiguous) rounded to BF16 and stored at
// out_row + cols.col[c].
void RoundRow(const TileCols& cols, uint16_t* out_row, const float* sums) {
  for (int64_t c = 0; c < cols.cols; ++c) out_row[cols.col[c]] = ToBf16(sums[c]);
}

// The portable path: the AVX-512 kernels' operations, lane by lane, in their order.

// A BF16 value as FP32, a subnormal read as a zero of its sign (VDPBF16PS's DAZ).
inline float FromBf16(uint16_t bits) {
  if ((bits & 0x7F80) == 0) bits &= 0x8000;
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof x);
  return x;
}

// x, or a zero of its sign where x is subnormal (VDPBF16PS's FTZ, on products and sums).
inline float Flush(float x) { return std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }

// One lane of VDPBF16PS as this CPU (AMD Zen 4) computes it: acc plus the odd pair's
// product, then plus the even one's, each sum rounded to FP32 once (a fused multiply-add:
// a product beyond FP32's range is neither rounded to infinity nor flushed before it is
// added) and flushed.
inline float DotBf16(float acc, float a_even, float a_odd, float b_even, float b_odd) {
  acc = Flush(std::fma(a_odd, b_odd, acc));
  return Flush(std::fma(a_even, b_even, acc));
}

// TileBf16 (below), portably.
template <int ROWS>
void PortableTileBf16(const uint16_t* const* a, const uint16_t* panel, int64_t k, int64_t pass,
                      float* const* out, const TileCols& cols) {
  for (int64_t k0 = 0; k0 < k; k0 += pass) {
    const int64_t len = std::min(pass, k - k0);
    float acc[ROWS][kTileCols] = {};
    for (int64_t p = 0; p < (len + 1) / 2; ++p, panel += 2 * kTileCols) {
      float b_even[kTileCols], b_odd[kTileCols];
      for (int64_t c = 0; c < kTileCols; ++c) {
        b_even[c] = FromBf16(panel[2 * c]);
        b_odd[c] = FromBf16(panel[2 * c + 1]);
      }
      const bool has_odd = 2 * p + 1 < len;  // else the last element is paired with zero
      for (int r = 0; r < ROWS; ++r) {
        const float a_even = FromBf16(a[r][k0 + 2 * p]);
        const float a_odd = has_odd ? FromBf16(a[r][k0 + 2 * p + 1]) : 0.0f;
        for (int64_t c = 0; c < kTileCols; ++c) {
          acc[r][c] = DotBf16(acc[r][c], a_even, a_odd, b_even[c], b_odd[c]);
        }
      }
    }
    for (int r = 0; r < ROWS; ++r) cols.Accumulate(out[r], acc[r], k0 == 0);
  }
}

// TileF32 (below), portably: one fused multiply-add per product.
template <int ROWS>
void PortableTileF32(const float* const* a, const float* panel, int64_t k, int64_t pass,
                     float* const* out, const TileCols& cols) {
  for (int64_t k0 = 0; k0 < k; k0 += pass) {
    const int64_t len = std::min(pass, k - k0);
    float acc[ROWS][kTileCols] = {};
    for (int64_t kk = 0; kk < len; ++kk, panel += kTileCols) {
      for (int r = 0; r < ROWS; ++r) {
        const float x = a[r][k0 + kk];
        for (int64_t c = 0; c < kTileCols; ++c) acc[r][c] = std::fma(x, panel[c], acc[r][c]);
      }
    }
    for (int r = 0; r < ROWS; ++r) cols.Accumulate(out[r], acc[r], k0 == 0);
  }
}

#if defined(__x86_64__)
#define TARGET_F32 __attribute__((target("avx512f")))
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))

bool HasAvx512F() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

bool HasAvx512Bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

// PackBf16, two vector loads per pair where the columns are contiguous.
TARGET_BF16 void PackBf16Avx512(const Rhs<uint16_t>& rhs, int64_t n0, int64_t pass,
                                uint16_t* out) {
  const int64_t cols = std::min(kTileCols, rhs.n - n0);
  if (!Contiguous(rhs.at.col + n0, cols)) return PackBf16(rhs, n0, pass, out);
  const __mmask32 mask = cols >= 32 ? ~0u : (1u << cols) - 1;
  // (even, odd) pairs of columns 0-15 and 16-31: lane 2c from the even row, 2c + 1 from
  // the odd one (index 32 + c)
  alignas(64) uint16_t low[32], high[32];
  for (int i = 0; i < 32; ++i) {
    low[i] = static_cast<uint16_t>(i / 2 + (i % 2) * 32);
    high[i] = static_cast<uint16_t>(16 + i / 2 + (i % 2) * 32);
  }
  const __m512i to_low = _mm512_load_si512(low), to_high = _mm512_load_si512(high);
  for (int64_t k0 = 0; k0 < rhs.k; k0 += pass) {
    const int64_t len = std::min(pass, rhs.k - k0);
    for (int64_t p = 0; p < (len + 1) / 2; ++p, out += 2 * kTileCols) {
      const int64_t even = k0 + 2 * p, odd = even + 1;
      const bool has_odd = 2 * p + 1 < len;
      const uint16_t* col = rhs.data + rhs.at.col[n0];
      const __m512i e = _mm512_maskz_loadu_epi16(mask, col + rhs.at.row[even]);
      const __m512i o = has_odd ? _mm512_maskz_loadu_epi16(mask, col + rhs.at.row[odd])
                                : _mm512_setzero_si512();
      _mm512_storeu_si512(out, _mm512_permutex2var_epi16(e, to_low, o));
      _mm512_storeu_si512(out + kTileCols, _mm512_permutex2var_epi16(e, to_high, o));
    }
  }
}

// TileCols::Accumulate of a pass's sums in two vectors, as vectors where the columns are
// contiguous. (Inlined into the tiles as it was when it was TileCols's: which NaN a sum of
// two NaNs gives depends on the order the compiler hands vaddps its operands.)
TARGET_F32 inline __attribute__((always_inline)) void Accumulate(const TileCols& cols,
                                                                 float* out_row, __m512 acc[2],
                                                                 bool first) {
  if (cols.contiguous) {
    float* o = out_row + cols.col[0];
    if (!first) {  // PSUM: the pass is added to the passes before it
      acc[0] = _mm512_add_ps(_mm512_maskz_loadu_ps(cols.m0, o), acc[0]);
      acc[1] = _mm512_add_ps(_mm512_maskz_loadu_ps(cols.m1, o + 16), acc[1]);
    }
    _mm512_mask_storeu_ps(o, cols.m0, acc[0]);
    _mm512_mask_storeu_ps(o + 16, cols.m1, acc[1]);
    return;
  }
  alignas(64) float sums[32];
  _mm512_store_ps(sums, acc[0]);
  _mm512_store_ps(sums + 16, acc[1]);
  cols.Accumulate(out_row, sums, first);
}

// ToBf16 of 16 lanes.
TARGET_F32 inline __m512i ToBf16(__m512i bits) {
  const __m512i high = _mm512_srli_epi32(bits, 16);
  const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                        _mm512_and_si512(high, _mm512_set1_epi32(1)));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __m512i quiet = _mm512_or_si512(_mm512_and_si512(high, _mm512_set1_epi32(0x8000)),
                                        _mm512_set1_epi32(0x7FC0));
  return _mm512_mask_mov_epi32(rounded, nan, quiet);
}

// RoundRow, as vectors where the result's columns are contiguous.
TARGET_F32 void RoundRowAvx512(const TileCols& cols, uint16_t* out_row, const float* sums) {
  if (!cols.contiguous) return RoundRow(cols, out_row, sums);
  uint16_t* o = out_row + cols.col[0];
  const __m512i low = _mm512_maskz_loadu_epi32(cols.m0, sums);
  const __m512i high = _mm512_maskz_loadu_epi32(cols.m1, sums + 16);
  _mm512_mask_cvtepi32_storeu_epi16(o, cols.m0, ToBf16(low));
  _mm512_mask_cvtepi32_storeu_epi16(o + 16, cols.m1, ToBf16(high));
}

// The result tile of ROWS rows (each from the lhs row at a[r], to the result row at out[r])
// and one packed panel of rhs, pass after pass.
template <int ROWS>
TARGET_BF16 void TileBf16(const uint16_t* const* a, const uint16_t* panel, int64_t k, int64_t pass,
                     float* const* out, const TileCols& cols) {
  for (int64_t k0 = 0; k0 < k; k0 += pass) {
    const int64_t len = std::min(pass, k - k0);
    __m512 acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const int64_t pairs = len / 2;
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(panel);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(panel + 32);
      panel += 64;
      for (int r = 0; r < ROWS; ++r) {
        uint32_t pair;
        std::memcpy(&pair, a[r] + k0 + 2 * p, sizeof pair);
        const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
      }
    }
    if (len % 2) {  // the last element alone, paired with zeros
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(panel);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(panel + 32);
      panel += 64;
      for (int r = 0; r < ROWS; ++r) {
        const uint32_t pair = a[r][k0 + len - 1];
        const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
      }
    }
    for (int r = 0; r < ROWS; ++r) Accumulate(cols, out[r], acc[r], k0 == 0);
  }
}

template <int ROWS>
TARGET_F32 void TileF32(const float* const* a, const float* panel, int64_t k, int64_t pass,
                    float* const* out, const TileCols& cols) {
  for (int64_t k0 = 0; k0 < k; k0 += pass) {
    const int64_t len = std::min(pass, k - k0);
    __m512 acc[ROWS][2];
    for (int r = 0; r < ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < len; ++kk) {
      const __m512 b0 = _mm512_loadu_ps(panel);
      const __m512 b1 = _mm512_loadu_ps(panel + 16);
      panel += 32;
      for (int r = 0; r < ROWS; ++r) {
        const __m512 x = _mm512_set1_ps(a[r][k0 + kk]);
        acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
      }
    }
    for (int r = 0; r < ROWS; ++r) Accumulate(cols, out[r], acc[r], k0 == 0);
  }
}
#endif  // defined(__x86_64__)

// Asks the kernel to back the result's memory with 2 MiB pages, as NumPy does for its arrays
// of 4 MiB and more, before the first write faults it in: a fresh result of 48 MiB (XLA:CPU
// allocates every result anew, and one this large is a fresh mapping each call) took 26-29
// ms more to write in 4 KiB pages than once faulted in, and 5-12 ms more in 2 MiB pages
// (on a 2-core AMD EPYC whose transparent huge pages are on where advised). Only advice:
// pages already there, or a kernel without such pages, are left as they are.
void AdviseHugePages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = 2 << 20, kMinBytes = 4 << 20;
  if (bytes < static_cast<int64_t>(kMinBytes)) return;
  const uintptr_t start = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) / kHuge * kHuge;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + bytes) / kHuge * kHuge;
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// Packed rhs panels, at a cache line's alignment: a vector load of a panel then never
// straddles two lines.
template <typename T>
class Packed {
 public:
  // Whether there is room for `elems` (false: out of memory).
  bool resize(int64_t elems) {
    const size_t bytes = (elems * sizeof(T) + kLine - 1) / kLine * kLine;
    if (bytes > bytes_) {
      data_.reset(static_cast<T*>(std::aligned_alloc(kLine, bytes)));
      bytes_ = data_ ? bytes : 0;
    }
    return data_ != nullptr;
  }
  T* data() { return data_.get(); }

 private:
  static constexpr size_t kLine = 64;
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  size_t bytes_ = 0;
};

// The result: one array, or parts of equal size that the offsets address as if they were
// one array, the first part's elements first (parts[i] holds elements [i * part, (i + 1) *
// part)); each row of a result tile must lie in one part (Run fails the call otherwise).
// Its elements are the FP32 sums, or those sums rounded to BF16 (`bf16`).
struct Out {
  std::vector<char*> parts;
  int64_t part;  // elements of each part
  bool bf16;

  int64_t ElementBytes() const { return bf16 ? sizeof(uint16_t) : sizeof(float); }

  // Where the `span` + 1 elements from `offset` are; null where they are in two parts.
  void* Row(int64_t offset, int64_t span) const {
    const int64_t i = offset / part;
    return (offset + span) / part == i ? parts[i] + offset % part * ElementBytes() : nullptr;
  }
};

// Rounds a row of a tile's FP32 sums to BF16 where the result's row is (RoundRow).
using Round = void (*)(const TileCols& cols, uint16_t* out_row, const float* sums);

// The shape of one call: batch x (m x k) @ (k x n), and where each operand's elements are.
template <typename T>
struct Problem {
  const T* lhs;
  const T* rhs;
  const Out& out;
  int64_t batch, m, k, n, pass;
  Offsets lhs_at, rhs_at, out_at;
};

ffi::Error NoMemory() {
  return ffi::Error(ffi::ErrorCode::kResourceExhausted,
                    "PassMatmul: no memory for the packed rhs panels");
}

ffi::Error SplitRow() {
  return ffi::Error::InvalidArgument("PassMatmul: a row of a result tile spans two parts "
                                     "of the result");
}

// The call's result, pack(...) packing rhs panels and tile(...) computing a result tile
// from one (its FP32 sums: into the result, or for a BF16 result into a tile held apart in
// L1 and then rounded into the result by `round`); an error when there was no memory for
// the panels, or a row of a result tile would span two parts of the result.
template <typename T, typename Pack, typename Tile>
ffi::Error Run(ffi::ThreadPool& pool, const Problem<T>& p, int64_t panel_elems, Pack pack,
               Tile tile, Round round) {
  const int64_t panels = (p.n + kTileCols - 1) / kTileCols;
  const int64_t block_rows = std::max<int64_t>(
      kTileRows, kBlockBytes / (p.k * static_cast<int64_t>(sizeof(T))) / kTileRows * kTileRows);
  const int64_t blocks = (p.m + block_rows - 1) / block_rows;
  const int64_t group_panels =
      std::max<int64_t>(1, kGroupBytes / (panel_elems * static_cast<int64_t>(sizeof(T))));
  std::atomic<bool> split_row{false};
  // Rows [block * block_rows, ...) of batch element b against one packed panel of its rhs.
  auto compute = [&](int64_t b, int64_t block, int64_t panel, const T* packed) {
    const T* lhs = p.lhs + p.lhs_at.batch[b];
    const TileCols cols(p.out_at.col + panel * kTileCols,
                        std::min(kTileCols, p.n - panel * kTileCols));
    const TileCols scratch = ScratchOf(cols);  // a tile held apart (a BF16 result)
    const int64_t end = std::min(p.m, (block + 1) * block_rows);
    for (int64_t row = block * block_rows; row < end; row += kTileRows) {
      const int64_t rows = std::min(kTileRows, end - row);
      const T* a[kTileRows];
      void* o[kTileRows];
      for (int64_t r = 0; r < rows; ++r) {
        a[r] = lhs + p.lhs_at.row[row + r];
        o[r] = p.out.Row(p.out_at.batch[b] + p.out_at.row[row + r] + cols.first, cols.span);
        if (o[r] == nullptr) {
          split_row = true;
          return;
        }
      }
      if (!p.out.bf16) {
        tile(rows, a, packed, reinterpret_cast<float* const*>(o), cols);
        continue;
      }
      // PSUM's FP32 tile in L1, rounded once into the result when its passes are done
      alignas(64) float sums[kTileRows][kTileCols];
      float* s[kTileRows];
      for (int64_t r = 0; r < rows; ++r) s[r] = sums[r];
      tile(rows, a, packed, s, scratch);
      for (int64_t r = 0; r < rows; ++r) round(cols, static_cast<uint16_t*>(o[r]), sums[r]);
    }
  };
  auto rhs_of = [&](int64_t b) { return Rhs<T>{p.rhs + p.rhs_at.batch[b], p.rhs_at, p.k, p.n}; };
  if (p.batch >= kBatchesPerThread * std::max<int64_t>(1, pool.num_threads())) {
    // Batch elements enough for every thread: each takes whole ones (no wait in between)
    std::atomic<bool> allocated{true};
    ParallelFor(pool, p.batch, [&](int64_t b) {
      thread_local Packed<T> packed;
      if (!packed.resize(panels * panel_elems)) {
        allocated = false;
        return;
      }
      for (int64_t panel = 0; panel < panels; ++panel) {
        pack(rhs_of(b), panel * kTileCols, p.pass, packed.data() + panel * panel_elems);
      }
      for (int64_t group = 0; group < panels; group += group_panels) {
        for (int64_t block = 0; block < blocks; ++block) {
          for (int64_t panel = group; panel < std::min(panels, group + group_panels); ++panel) {
            compute(b, block, panel, packed.data() + panel * panel_elems);
          }
        }
      }
    });
    if (!allocated) return NoMemory();
    return split_row ? SplitRow() : ffi::Error::Success();
  }
  Packed<T> packed;
  if (!packed.resize(panels * panel_elems)) return NoMemory();
  for (int64_t b = 0; b < p.batch; ++b) {  // the threads share each batch element
    ParallelFor(pool, panels, [&](int64_t panel) {
      pack(rhs_of(b), panel * kTileCols, p.pass, packed.data() + panel * panel_elems);
    });
    ParallelFor(pool, blocks * panels, [&](int64_t item) {
      // items in order: each group of panels with every block of rows, group after group
      const int64_t group = item / (blocks * group_panels), rest = item % (blocks * group_panels);
      const int64_t in_group = std::min(group_panels, panels - group * group_panels);
      const int64_t panel = group * group_panels + rest % in_group;
      compute(b, rest / in_group, panel, packed.data() + panel * panel_elems);
    });
  }
  return split_row ? SplitRow() : ffi::Error::Success();
}

#define DISPATCH_ROWS(call)                                    \
  switch (rows) {                                               \
    case 1: call(1); break;                                     \
    case 2: call(2); break;                                     \
    case 3: call(3); break;                                     \
    case 4: call(4); break;                                     \
    case 5: call(5); break;                                     \
    case 6: call(6); break;                                     \
    case 7: call(7); break;                                     \
    default: call(8); break;                                    \
  }

using Table = std::vector<int64_t>;

// The offset tables, in the order PassMatmul's `offsets` attribute gives them.
enum { kLhsBatch, kLhsRow, kRhsBatch, kRhsK, kRhsCol, kOutBatch, kOutRow, kOutCol, kTables };

// The tables the attribute `offsets` describes (native.py's Offsets): for each table in
// turn, the number of dims it runs over, then each dim's size and stride (in elements). A
// table's offsets are the sums of one index of each dim times its stride, enumerated
// row-major. They are made here, at each call, rather than passed as arrays: XLA turns a
// constant array argument into kernels of its own, which cost more to compile than the
// tables cost to make. False where the attribute is not such a description.
bool MakeTables(ffi::Span<const int64_t> offsets, Table (&tables)[kTables]) {
  const int64_t length = static_cast<int64_t>(offsets.size());
  int64_t i = 0;
  for (Table& table : tables) {
    if (i >= length) return false;
    const int64_t dims = offsets[i++];
    if (dims < 0 || length - i < 2 * dims) return false;
    table.assign(1, 0);
    for (int64_t d = 0; d < dims; ++d, i += 2) {
      const int64_t size = offsets[i], stride = offsets[i + 1];
      if (size < 0) return false;
      Table stepped;
      stepped.reserve(table.size() * size);
      for (int64_t at : table) {
        for (int64_t j = 0; j < size; ++j) stepped.push_back(at + j * stride);
      }
      table.swap(stepped);
    }
  }
  return i == length;
}

// Whether every sum of one offset from each table (and at most `last` in all) is in
// [0, last]: each table's offsets are at least 0, and their largest add up to at most
// `last`. The tables are not empty.
bool Inside(std::initializer_list<const Table*> tables, int64_t last) {
  for (const Table* table : tables) {
    const auto [low, high] = std::minmax_element(table->begin(), table->end());
    if (*low < 0 || *high > last) return false;
    last -= *high;  // what the tables after it may still add
  }
  return true;
}

ffi::Error PassMatmulImpl(ffi::ThreadPool pool, ffi::AnyBuffer lhs, ffi::AnyBuffer rhs,
                          ffi::RemainingRets results, ffi::Span<const int64_t> offsets,
                          int64_t pass_size, bool portable) {
  Table t[kTables];
  if (!MakeTables(offsets, t)) {
    return ffi::Error::InvalidArgument("PassMatmul: offsets of 8 tables, each its dims' "
                                       "count then their sizes and strides");
  }
  const int64_t batch = t[kLhsBatch].size(), m = t[kLhsRow].size(), k = t[kRhsK].size(),
                n = t[kRhsCol].size();
  Out out{{}, 0, false};
  for (size_t i = 0; i < results.size(); ++i) {
    auto part = results.get<ffi::AnyBuffer>(i);
    if (part.has_error()) return part.error();
    const ffi::DataType type = (*part)->element_type();
    if ((type != ffi::F32 && type != ffi::BF16) ||
        (i > 0 && (static_cast<int64_t>((*part)->element_count()) != out.part ||
                   (type == ffi::BF16) != out.bf16))) {
      return ffi::Error::InvalidArgument("PassMatmul: FP32 or BF16 results of one type and "
                                         "size");
    }
    out.part = (*part)->element_count();
    out.bf16 = type == ffi::BF16;
    out.parts.push_back(static_cast<char*>((*part)->untyped_data()));
  }
  if (lhs.element_type() != rhs.element_type() || out.parts.empty() ||
      static_cast<int64_t>(t[kRhsBatch].size()) != batch ||
      static_cast<int64_t>(t[kOutBatch].size()) != batch ||
      static_cast<int64_t>(t[kOutRow].size()) != m ||
      static_cast<int64_t>(t[kOutCol].size()) != n ||
      static_cast<int64_t>(out.parts.size()) * out.part != batch * m * n) {
    return ffi::Error::InvalidArgument("PassMatmul: operands of one type, results, and "
                                       "offset tables of matching sizes");
  }
  if (pass_size < 1 || k < 1) {
    return ffi::Error::InvalidArgument("PassMatmul: a pass size and K of at least 1");
  }
  if (batch * m * n == 0) return ffi::Error::Success();  // an empty result
  // The last element each operand's tables reach, in elements: lhs's rows run k long
  if (!Inside({&t[kLhsBatch], &t[kLhsRow]}, static_cast<int64_t>(lhs.element_count()) - k)) {
    return ffi::Error::InvalidArgument("PassMatmul: lhs's offsets reach outside lhs");
  }
  if (!Inside({&t[kRhsBatch], &t[kRhsK], &t[kRhsCol]},
              static_cast<int64_t>(rhs.element_count()) - 1)) {
    return ffi::Error::InvalidArgument("PassMatmul: rhs's offsets reach outside rhs");
  }
  if (!Inside({&t[kOutBatch], &t[kOutRow], &t[kOutCol]}, batch * m * n - 1)) {
    return ffi::Error::InvalidArgument("PassMatmul: the result's offsets reach outside it");
  }
  const Offsets lhs_at{t[kLhsBatch].data(), t[kLhsRow].data(), nullptr},
      rhs_at{t[kRhsBatch].data(), t[kRhsK].data(), t[kRhsCol].data()},
      out_at{t[kOutBatch].data(), t[kOutRow].data(), t[kOutCol].data()};
  for (char* part : out.parts) AdviseHugePages(part, out.part * out.ElementBytes());
  if (lhs.element_type() == ffi::BF16) {
    const Problem<uint16_t> p{static_cast<const uint16_t*>(lhs.untyped_data()),
                              static_cast<const uint16_t*>(rhs.untyped_data()), out, batch,
                              m, k, n, pass_size, lhs_at, rhs_at, out_at};
    const int64_t passes = (k + pass_size - 1) / pass_size;
    const int64_t panel_elems = (k + passes) * kTileCols;  // with room for odd passes' pads
#if defined(__x86_64__)
    if (!portable && Avx512(/*bf16=*/1)) {
      return Run(pool, p, panel_elems, PackBf16Avx512,
                 [&](int64_t rows, const uint16_t* const* a, const uint16_t* panel,
                     float* const* out_rows, const TileCols& cols) {
#define CALL(R) TileBf16<R>(a, panel, k, pass_size, out_rows, cols)
                   DISPATCH_ROWS(CALL)
#undef CALL
                 },
                 RoundRowAvx512);
    } else  // the portable path
#endif
    {
      return Run(pool, p, panel_elems, PackBf16,
                 [&](int64_t rows, const uint16_t* const* a, const uint16_t* panel,
                     float* const* out_rows, const TileCols& cols) {
#define CALL(R) PortableTileBf16<R>(a, panel, k, pass_size, out_rows, cols)
                   DISPATCH_ROWS(CALL)
#undef CALL
                 },
                 RoundRow);
    }
  } else if (lhs.element_type() == ffi::F32) {
    const Problem<float> p{static_cast<const float*>(lhs.untyped_data()),
                           static_cast<const float*>(rhs.untyped_data()), out, batch, m, k, n,
                           pass_size, lhs_at, rhs_at, out_at};
#if defined(__x86_64__)
    if (!portable && Avx512(/*bf16=*/0)) {
      return Run(pool, p, k * kTileCols, PackF32,
                 [&](int64_t rows, const float* const* a, const float* panel,
                     float* const* out_rows, const TileCols& cols) {
#define CALL(R) TileF32<R>(a, panel, k, pass_size, out_rows, cols)
                   DISPATCH_ROWS(CALL)
#undef CALL
                 },
                 RoundRowAvx512);
    } else  // the portable path
#endif
    {
      return Run(pool, p, k * kTileCols, PackF32,
                 [&](int64_t rows, const float* const* a, const float* panel,
                     float* const* out_rows, const TileCols& cols) {
#define CALL(R) PortableTileF32<R>(a, panel, k, pass_size, out_rows, cols)
                   DISPATCH_ROWS(CALL)
#undef CALL
                 },
                 RoundRow);
    }
  }
  return ffi::Error::InvalidArgument("PassMatmul: BF16 or FP32 operands");
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(PassMatmul, PassMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // lhs
                                  .Arg<ffi::AnyBuffer>()  // rhs
                                  .RemainingRets()        // the result, or its parts
                                  .Attr<ffi::Span<const int64_t>>("offsets")  // MakeTables
                                  .Attr<int64_t>("pass_size")
                                  .Attr<bool>("portable"));  // the portable path, here too

// The columns of a result tile: a row of a tile is never split between parts of a result.
extern "C" int TileColumns() { return kTileCols; }

// The n FP32 values `in` rounded to BF16 into `out` as the loop rounds a BF16 result: by
// its AVX-512 code (where the CPU has AVX-512F and `portable` is 0) or its portable path
// (for checks against XLA:CPU's conversion, tests and benchmarks/bf16_rounding.py).
extern "C" void RoundToBf16(const float* in, uint16_t* out, int64_t n, int portable) {
  Round round = RoundRow;
#if defined(__x86_64__)
  if (!portable && Avx512(/*bf16=*/0)) round = RoundRowAvx512;
#endif
  for (int64_t i = 0; i < n; i += kTileCols) {
    round(TileCols(kScratchCols, std::min(kTileCols, n - i)), out + i, in + i);
  }
}

// Whether PassMatmul runs its AVX-512 code (rather than the portable path) on this CPU for
// operands of BF16 (bf16 != 0) or FP32.
extern "C" int Avx512(int bf16) {
#if defined(__x86_64__)
  static const bool f32 = HasAvx512F(), with_bf16 = HasAvx512Bf16();
  return bf16 ? with_bf16 : f32;
#else
  (void)bf16;
  return 0;
#endif
}
