#include "tensor/cuda/graph.h"

#include <cstdio>
#include <exception>
#include <string>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

constexpr const char* kCaptureHint =
    ". A CUDA graph capture records device work without running it, so nothing in the "
    "captured function may wait for the device (.item(), a copy to host memory, an event's "
    "synchronize) or allocate outside the caching allocator; move that work before or after "
    "the capture (Note [CUDA Graphs] in tensor/cuda/graph.h)";

}  // namespace

Graph::Graph(int device) : device_(device) {
  check_device_index(device);
}

Graph::~Graph() {
  DeviceGuard guard(device_);
  if (exec_ != nullptr) LOOM_CUDA_WARN(cudaGraphExecDestroy(exec_));
  if (graph_ != nullptr) LOOM_CUDA_WARN(cudaGraphDestroy(graph_));
  if (pool_ != 0) {
    try {
      caching_allocator(device_).release_pool(pool_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%swarning: %s\n", tag::kCuda.prefix().c_str(), e.what());
    }
  }
}

void Graph::capture(const std::function<void()>& work) {
  if (captured()) tag::kCuda.fail("Graph::capture: this graph already holds a capture");
  DeviceGuard guard(device_);
  const cudaStream_t stream = compute_stream(device_);
  if (current_stream(device_) != stream) {
    tag::kCuda.fail("Graph::capture: the thread's current stream for cuda:", device_,
                    " is not its compute stream (a StreamGuard is active); graphs capture the "
                    "compute stream only");
  }
  CachingAllocator& allocator = caching_allocator(device_);
  const PoolId pool = allocator.begin_capture(stream);
  // Ends the capture however `work` ended: the graph when it succeeded, else nothing.
  auto end = [&](bool keep) -> cudaError_t {
    cudaGraph_t graph = nullptr;
    const cudaError_t status = cudaStreamEndCapture(stream, &graph);
    (void)cudaGetLastError();  // a refused call's error is reported by the caller below
    allocator.end_capture();
    if (keep && status == cudaSuccess) {
      graph_ = graph;
      pool_ = pool;
    } else {
      if (graph != nullptr) LOOM_CUDA_WARN(cudaGraphDestroy(graph));
      allocator.release_pool(pool);
    }
    return status;
  };
  const cudaError_t begun = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
  if (begun != cudaSuccess) {
    allocator.end_capture();
    allocator.release_pool(pool);
    LOOM_CUDA_CHECK(begun);
  }
  try {
    work();
  } catch (const std::exception& e) {
    // The hint only where CUDA refused a call because of the capture (its error names say
    // "StreamCapture"), not for an error of `work` itself.
    end(false);
    tag::kCuda.fail("Graph::capture on cuda:", device_, ": the captured function failed: ",
                    e.what(), std::string(e.what()).find("StreamCapture") != std::string::npos
                                  ? kCaptureHint
                                  : "");
  }
  const cudaError_t ended = end(true);
  if (ended != cudaSuccess) {
    tag::kCuda.fail("Graph::capture on cuda:", device_, ": cudaStreamEndCapture failed with ",
                    cudaGetErrorName(ended), " (", cudaGetErrorString(ended),
                    "): a call made during the capture was refused", kCaptureHint);
  }
  LOOM_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
}

void Graph::replay() {
  if (!captured()) tag::kCuda.fail("Graph::replay on cuda:", device_, ": nothing was captured");
  DeviceGuard guard(device_);
  LOOM_CUDA_CHECK(cudaGraphLaunch(exec_, compute_stream(device_)));
}

}  // namespace loom::cuda
