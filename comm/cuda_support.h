#pragma once
// What the process group needs from the CUDA runtime, behind declarations that compile
// without it: a build with CUDA implements them in comm/cuda/, a CPU-only build in
// comm/cuda_support_stub.cpp (where no CUDA tensor can exist to reach them).

#include <memory>

#include "comm/backend.h"

namespace loom::comm {

// Note [Issue streams]
// A collective on CUDA tensors is ordered after the work the caller queued before issuing
// it: the work on the caller's current stream (loom::cuda::current_stream, which a
// StreamGuard may override for the calling thread). The operation may run later on the
// group's progress thread, whose current stream is the compute stream, so the group
// captures the caller's stream when the operation is issued and reinstates it on the thread
// that runs the operation (IssueStreamScope). Backends then simply use current_stream().
struct IssueStream {
  int device = -1;         // -1: nothing captured (CPU tensors, barrier)
  void* stream = nullptr;  // the cudaStream_t
};

// The calling thread's current stream of a CUDA `device`; nothing for the CPU.
IssueStream capture_issue_stream(Device device);

// Makes the captured stream the current stream of its device on the calling thread for the
// scope's lifetime (nothing when nothing was captured).
class IssueStreamScope {
 public:
  explicit IssueStreamScope(const IssueStream& stream);
  ~IssueStreamScope();
  IssueStreamScope(const IssueStreamScope&) = delete;
  IssueStreamScope& operator=(const IssueStreamScope&) = delete;

 private:
  struct Guard;
  std::unique_ptr<Guard> guard_;
};

// A backend that runs `host` (a host backend) on CUDA tensors of any device by staging them
// through pinned host memory (comm/cuda/staging_backend.h). `host` must outlive it. In a
// build without CUDA: loom::Error.
std::unique_ptr<Backend> make_staging_backend(Backend& host);

}  // namespace loom::comm
