// ParallelFor: a loop shared between the calling thread and the XLA FFI's intra-op thread
// pool (the native kernels pass_matmul.cc and fixed_order_reduce.cc).

#ifndef MESH_ISA_KERNELS_PARALLEL_FOR_H_
#define MESH_ISA_KERNELS_PARALLEL_FOR_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

// Runs fn(0) .. fn(count - 1) on the calling thread and the FFI's intra-op thread pool. The
// caller takes items too, so it never waits on a task that has not started; a task that
// starts after the last item was taken does nothing (the state outlives the call).
inline void ParallelFor(xla::ffi::ThreadPool& pool, int64_t count,
                        const std::function<void(int64_t)>& fn) {
  struct State {
    std::atomic<int64_t> next{0}, done{0};
    const std::function<void(int64_t)>* fn;
    int64_t count;
    void Work() {
      for (int64_t i; (i = next.fetch_add(1)) < count;) {
        (*fn)(i);
        done.fetch_add(1, std::memory_order_release);
      }
    }
  };
  auto state = std::make_shared<State>();
  state->fn = &fn;
  state->count = count;
  const int64_t helpers = std::min<int64_t>(pool.num_threads(), count - 1);
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([state] { state->Work(); });
  state->Work();
  while (state->done.load(std::memory_order_acquire) < count) std::this_thread::yield();
}

#endif  // MESH_ISA_KERNELS_PARALLEL_FOR_H_
