#pragma once
// CUDA Graphs: device work captured once and replayed with one launch.
//
// Note [CUDA Graphs]
// Graph::capture(work) runs `work` on the host while the device's compute stream captures:
// the kernels, copies and matmuls it issues are recorded, not run, and each replay() runs
// them all with one launch, saving the host's time per launch (about 4 us) and the gaps
// between kernels. What the host did inside `work` (autograd bookkeeping, choosing kernels
// and their arguments) is not repeated: a replay does exactly what the capture recorded, on
// the same memory, with the same scalar arguments. So:
//  - inputs are read from tensors allocated before the capture: copy new values into them
//    before each replay; results are the tensors the capture left behind, rewritten in place
//    by each replay;
//  - the capture's allocations come from a private pool of the caching allocator (Note
//    [Private pools for graph capture]), so no other tensor is ever given memory a replay
//    writes; the pool joins the shared cache when the Graph is destroyed;
//  - nothing in `work` may wait for the device: `.item()`, a copy to host memory, an event's
//    synchronize, cudaMalloc outside the allocator. CUDA refuses the call, the capture fails
//    and capture() throws loom::Error naming the refused call;
//  - scalars passed to kernels by value (a learning rate, a step count, a clipping factor
//    computed on the host) are frozen at capture;
//  - only the compute stream is captured (work on the comm stream or under a StreamGuard is
//    refused by the check below or runs eagerly at capture time), and one capture per device
//    at a time. The capture mode is global, as PyTorch's default: another thread's
//    potentially unsafe call during the capture also fails it.
// The emulated runtime records and replays captures as CUDA does (Note [Emulated graphs] in
// tests/cuda_emulation/runtime/stream_capture.h), so this is tested without a GPU.

#include <cuda_runtime_api.h>

#include <functional>

#include "tensor/cuda/caching_allocator.h"

namespace loom::cuda {

class Graph {
 public:
  // A graph for cuda:`device`; nothing is captured yet.
  explicit Graph(int device);
  // Destroys the graph and releases its pool to the shared cache. Tensors the capture
  // allocated may outlive it.
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Records the device work `work` issues (see the Note). Throws loom::Error when something
  // in `work` is refused by the capture, when `work` throws (the error is passed on, with the
  // capture ended and its pool released), when the thread's current stream for the device is
  // not the compute stream, or when this Graph already holds a capture.
  void capture(const std::function<void()>& work);
  // Runs the captured work on the compute stream, asynchronously. Throws loom::Error before
  // a capture.
  void replay();
  bool captured() const { return exec_ != nullptr; }

 private:
  int device_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  PoolId pool_ = 0;
};

}  // namespace loom::cuda
