#pragma once
// Setup that a stream capture would refuse, made safe to run during one.
//
// While a stream captures (tensor/cuda/graph.h), CUDA refuses the potentially unsafe calls
// (cudaMalloc, a blocking cudaMemcpy, ...) from every thread whose capture mode is the
// default. Resources created once and kept for good (cuBLASLt's workspace, a segment of the
// caching allocator) are not part of any graph, only their addresses are, so creating them
// mid-capture is safe: RelaxedCaptureMode lets the calling thread make those calls for its
// lifetime (cudaThreadExchangeStreamCaptureMode, used push-pop as CUDA's documentation asks).

#include <cuda_runtime_api.h>

#include "kernels/cuda/check.h"

namespace loom::kernels::cuda {

class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { LOOM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  ~RelaxedCaptureMode() { LOOM_CUDA_WARN(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace loom::kernels::cuda
