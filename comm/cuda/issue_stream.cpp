// Issue streams (Note [Issue streams] in comm/cuda_support.h) in a build with CUDA.

#include <cuda_runtime_api.h>

#include "comm/cuda_support.h"
#include "tensor/cuda/stream.h"

namespace loom::comm {

struct IssueStreamScope::Guard {
  Guard(int device, cudaStream_t stream) : guard(device, stream) {}
  cuda::StreamGuard guard;
};

IssueStream capture_issue_stream(Device device) {
  if (!device.is_cuda()) return {};
  return {device.index, static_cast<void*>(cuda::current_stream(device.index))};
}

IssueStreamScope::IssueStreamScope(const IssueStream& stream) {
  if (stream.device < 0) return;
  guard_ = std::make_unique<Guard>(stream.device, static_cast<cudaStream_t>(stream.stream));
}

IssueStreamScope::~IssueStreamScope() = default;

}  // namespace loom::comm
