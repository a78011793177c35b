#pragma once
// Intra-op threads for the CPU kernels: one process-wide pool whose parallel_for splits a range
// into contiguous chunks. Kernels split only what does not change a result: independent
// elements, rows, columns, matrices of a batch, fixed blocks of a GEMM (gemm.h); a sum is
// never split, so every kernel gives the same bits whatever the thread count.
//
//   kernels::cpu::set_num_threads(4);
//   kernels::cpu::parallel_for(n, 1 << 15, [&](int64_t begin, int64_t end) { ... });
//
// Threading: the calling thread runs the first chunk and waits for the rest. Nested calls,
// and calls from a second thread while the pool is busy (the replicas of the `dp` strategy
// are threads), run inline on their caller.

#include <cstdint>
#include <functional>

namespace loom::kernels::cpu {

// Threads used by parallel_for, the caller included (default 1: no worker threads).
// Throws loom::Error for n < 1 or above 2^20.
void set_num_threads(int n);
int num_threads();

// Runs body over [0, n) in chunks of at least `grain` elements, at most num_threads() of
// them, chunk i covering [i*n/c, (i+1)*n/c).
void parallel_for(int64_t n, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end)>& body);

// Work below this many elements stays on the caller: waking a worker costs more.
inline constexpr int64_t kMinParallelElements = int64_t{1} << 14;

// parallel_for over `rows` rows of `width` elements each, in chunks of at least
// kMinParallelElements elements.
void parallel_rows(int64_t rows, int64_t width,
                   const std::function<void(int64_t begin, int64_t end)>& body);

}  // namespace loom::kernels::cpu
