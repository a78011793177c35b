#include "tensor/ops/cuda_support.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/check.h"
#include "tensor/cuda/stream.h"
#endif

namespace loom::detail {

#if LOOM_WITH_CUDA

cudaStream_t stream_of(const Tensor& t) {
  // cudaGetDevice reads a thread-local; cudaSetDevice is only paid when the device changes.
  int index = t.device().index, current = -1;
  LOOM_CUDA_CHECK(cudaGetDevice(&current));
  if (current != index) LOOM_CUDA_CHECK(cudaSetDevice(index));
  return cuda::current_stream(index);
}

Tensor workspace(Device device, size_t bytes) {
  return Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, device);
}

#else

void fail_without_cuda() {
  fail("a CUDA tensor reached an op in a build without CUDA; rebuild with -DLOOM_WITH_CUDA=ON");
}

#endif

}  // namespace loom::detail
