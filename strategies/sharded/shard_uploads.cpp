#include "strategies/sharded/shard_uploads.h"

#if LOOM_WITH_CUDA
#include "tensor/cuda/stream.h"
#endif

namespace loom::strategies::sharded {

comm::WorkPtr all_gather_from_host(comm::ProcessGroup& group, Tensor& full, const Tensor& shard) {
#if LOOM_WITH_CUDA
  if (full.device().is_cuda()) {
    const int device = full.device().index;
    const cudaStream_t copies = cuda::copy_stream(device);
    cuda::Event queued;  // what may still use `full`'s memory
    queued.record(cuda::current_stream(device));
    queued.wait_on(copies);
    cuda::StreamGuard on_copies(device, copies);  // the upload, and the collective's issue
    return group.all_gather(full, shard.to(full.device()));
  }
#endif
  return group.all_gather(full, shard.to(full.device()));
}

}  // namespace loom::strategies::sharded
