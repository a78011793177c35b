#include "strategies/sharded/gradient_downloads.h"

#include <cstdio>
#include <exception>

#include "core/tags.h"
#include "tensor/ops.h"

#if LOOM_WITH_CUDA
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/copy.h"
#endif

namespace loom::strategies::sharded {

GradientDownloads::~GradientDownloads() {
  try {
    finish();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%swarning: an offloaded gradient's download failed: %s\n",
                 tag::kSharded.prefix().c_str(), e.what());
  }
}

void GradientDownloads::start(Tensor& dst, const Tensor& src) {
#if LOOM_WITH_CUDA
  const bool overlappable = src.device().is_cuda() && dst.device().is_cpu() && dst.is_pinned() &&
                            dst.dtype() == src.dtype() && dst.shape() == src.shape() &&
                            dst.is_contiguous() && src.is_contiguous();
  if (overlappable) {
    if (src.numel() == 0) return;
    const int device = src.device().index;
    const cudaStream_t copies = cuda::copy_stream(device);
    cuda::Event produced;  // the work that wrote `src`, queued so far on the current stream
    produced.record(cuda::current_stream(device));
    produced.wait_on(copies);
    cuda::copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), src.nbytes(),
                     copies);
    cuda::record_stream(src.storage()->data(), copies);
    pending_.emplace_back();
    pending_.back().record(copies);
    return;
  }
#endif
  copy_(dst, src);
}

void GradientDownloads::finish() {
#if LOOM_WITH_CUDA
  for (const cuda::Event& done : pending_)
    done.synchronize();
  pending_.clear();
#endif
}

}  // namespace loom::strategies::sharded
