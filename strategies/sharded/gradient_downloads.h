#pragma once
// Note [Offloaded gradients on the copy stream]
// Under CPU offload on a GPU, a unit's reduced gradient shard goes to its pinned host copy
// (FlatParam::master_grad, which the CPU optimizer reads) as soon as the reduction is waited
// for, during backward. Copied on the compute stream with copy_, each download would stall
// the host until the GPU had drained, and the GPU's kernels while the bytes crossed. Instead,
// as ZeRO-Offload overlaps its gradient transfers with backward, each download waits (on the
// device) for the work already queued on the current stream, runs on the device's copy stream
// (tensor/cuda/stream.h) while later backward kernels run on the compute stream, and records
// an event; the host waits for all of them once, before the optimizer reads the gradients
// (ShardedEngine::finalize_backward). The source's block is declared in use by the copy
// stream, so the caching allocator does not hand it out again before the copy has read it.
// Anything else (CPU tensors, pageable or converting copies) is an ordinary copy_.

#include <vector>

#include "tensor/tensor.h"

#if LOOM_WITH_CUDA
#include "tensor/cuda/stream.h"
#endif

namespace loom::strategies::sharded {

class GradientDownloads {
 public:
  GradientDownloads() = default;
  GradientDownloads(const GradientDownloads&) = delete;
  GradientDownloads& operator=(const GradientDownloads&) = delete;
  // Waits for downloads still in flight (their destinations may be freed next); reports, never
  // throws, a failure.
  ~GradientDownloads();

  // Copies `src` into `dst` (same shape): on the copy stream when `src` is on a GPU and `dst`
  // contiguous pinned host memory of the same dtype and `src` contiguous, finished by
  // finish(); otherwise at once.
  void start(Tensor& dst, const Tensor& src);
  // Blocks until every download started has finished. Throws loom::Error for a failed copy.
  void finish();

 private:
#if LOOM_WITH_CUDA
  std::vector<cuda::Event> pending_;
#endif
};

}  // namespace loom::strategies::sharded
