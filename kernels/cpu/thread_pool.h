#pragma once
// Intra-op threads for the CPU kernels: one process-wide pool whose parallel_for splits a range
// into a fixed number of contiguous chunks, so that a kernel whose elements are independent
// (the optimizer steps) gives the same bits whatever the thread count. Reductions are not
// split here (their result would depend on the partition).
//
//   kernels::cpu::set_num_threads(4);
//   kernels::cpu::parallel_for(n, 1 << 15, [&](int64_t begin, int64_t end) { ... });
//
// Threading: parallel_for may be called from any one thread at a time (the training
// thread); the calling thread runs the first chunk and waits for the rest. Nested calls run
// inline.

#include <cstdint>
#include <functional>

namespace loom::kernels::cpu {

// Threads used by parallel_for, the caller included (default 1: no worker threads).
// Throws loom::Error for n < 1.
void set_num_threads(int n);
int num_threads();

// Runs body over [0, n) in chunks of at least `grain` elements, at most num_threads() of
// them, chunk i covering [i*n/c, (i+1)*n/c).
void parallel_for(int64_t n, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end)>& body);

}  // namespace loom::kernels::cpu
