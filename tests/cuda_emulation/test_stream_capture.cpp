// Stream capture and CUDA Graphs on the emulated device (Note [Emulated graphs] in
// runtime/stream_capture.h): captured work runs at each graph launch, not before, with the
// arguments it was issued with; the calls CUDA refuses during a capture are refused here.

#include <cuda_runtime.h>

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "emulator.h"
#include "stream_capture.h"
#include "work_log.h"

namespace emu = loom::cuda_emulation;

namespace {

void add_value(float* data, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] += value;
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Ends a capture a failed test left open.
void end_capture(cudaStream_t stream) {
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(stream, &status), cudaSuccess);
  cudaGraph_t graph = nullptr;
  if (status != cudaStreamCaptureStatusNone) cudaStreamEndCapture(stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
}

TEST(StreamCapture, CapturedWorkRunsAtEachLaunchWithItsArguments) {
  Stream stream;
  std::vector<float> data(40, 1.0f), source(40, 5.0f);
  emu::WorkLog log;
  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  float value = 2.0f;
  emu::launch("add_value", add_value, dim3(2), dim3(32), 0, stream.s)(data.data(), value, 40);
  value = 100.0f;  // the launch converted its arguments when issued
  ASSERT_EQ(cudaMemcpyAsync(data.data(), source.data(), 4 * sizeof(float), cudaMemcpyDefault,
                            stream.s),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(data.data() + 39, 0, sizeof(float), stream.s), cudaSuccess);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(stream.s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusActive);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream.s, &graph), cudaSuccess);
  EXPECT_EQ(data, std::vector<float>(40, 1.0f)) << "nothing runs while captured";
  EXPECT_EQ(log.launches(), 0u);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // the instantiated graph keeps its work
  for (int launch = 1; launch <= 3; ++launch) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream.s), cudaSuccess);
    // Each launch: + 2 everywhere, then the copy over the first 4 and the fill of the last.
    EXPECT_EQ(data[0], 5.0f);
    EXPECT_EQ(data[10], 1.0f + 2.0f * static_cast<float>(launch));
    EXPECT_EQ(data[39], 0.0f);
  }
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(log.launches(), 3u) << "the kernel, once per graph launch";
  EXPECT_EQ(log.host_launches(), 3u) << "three graph launches";
  const std::vector<emu::Work> work = log.entries();
  ASSERT_EQ(work.size(), 12u);
  EXPECT_EQ(work[0].kind, emu::WorkKind::kGraph);
  EXPECT_EQ(work[1].name, "add_value");
  EXPECT_TRUE(work[1].replayed);
  EXPECT_EQ(work[2].kind, emu::WorkKind::kCopy);
  EXPECT_EQ(work[3].kind, emu::WorkKind::kFill);
}

TEST(StreamCapture, ASynchronisingCallInvalidatesTheCapture) {
  Stream stream;
  std::vector<float> data(32, 1.0f);
  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  emu::launch("add_value", add_value, dim3(1), dim3(32), 0, stream.s)(data.data(), 1.0f, 32);
  EXPECT_EQ(cudaStreamSynchronize(stream.s), cudaErrorStreamCaptureUnsupported);
  cudaStreamCaptureStatus status;
  ASSERT_EQ(cudaStreamIsCapturing(stream.s, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusInvalidated);
  EXPECT_EQ(cudaMemsetAsync(data.data(), 0, 4, stream.s), cudaErrorStreamCaptureInvalidated);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream.s, &graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(graph, nullptr);
  EXPECT_EQ(data, std::vector<float>(32, 1.0f));
  EXPECT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess) << "the capture has ended";
}

TEST(StreamCapture, UnsafeCallsFollowTheCaptureModes) {
  Stream stream;
  void* p = nullptr;
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
  // Global: refused on this thread and on any other whose mode is global.
  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaError_t other_thread = cudaSuccess;
  std::thread([&] { other_thread = cudaDeviceSynchronize(); }).join();
  EXPECT_EQ(other_thread, cudaErrorStreamCaptureUnsupported);
  end_capture(stream.s);
  for (auto call : {+[](void** q, cudaEvent_t) { return cudaMalloc(q, 64); },
                    +[](void**, cudaEvent_t e) { return cudaEventQuery(e); },
                    +[](void**, cudaEvent_t) { return cudaFree(nullptr); },
                    +[](void**, cudaEvent_t) { return cudaDeviceSynchronize(); }}) {
    ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(call(&p, event), cudaErrorStreamCaptureUnsupported);
    end_capture(stream.s);
  }
  // A thread that made its mode relaxed may allocate (what an allocator does mid-capture).
  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);
  EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream.s, &graph), cudaSuccess);
  cudaGraphDestroy(graph);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  // Thread-local: other threads are free.
  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  std::thread([&] { other_thread = cudaDeviceSynchronize(); }).join();
  EXPECT_EQ(other_thread, cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
  end_capture(stream.s);
  cudaEventDestroy(event);
}

TEST(StreamCapture, RefusesWhatCudaRefuses) {
  Stream stream, other;
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal),
            cudaErrorStreamCaptureUnsupported)
      << "the legacy stream";
  EXPECT_EQ(cudaStreamEndCapture(stream.s, &graph), cudaErrorIllegalState) << "not capturing";
  ASSERT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(stream.s, cudaStreamCaptureModeGlobal), cudaErrorIllegalState);
  // Ended on another thread.
  cudaError_t ended = cudaSuccess;
  std::thread([&] { ended = cudaStreamEndCapture(stream.s, &graph); }).join();
  EXPECT_EQ(ended, cudaErrorStreamCaptureWrongThread);
  // An event recorded in the capture, waited on by another stream: a multi-stream capture.
  cudaEvent_t event = nullptr;
  ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, stream.s), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(stream.s, event, 0), cudaSuccess);
  EXPECT_EQ(cudaStreamWaitEvent(other.s, event, 0), cudaErrorStreamCaptureIsolation);
  ASSERT_EQ(cudaStreamEndCapture(stream.s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(other.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaGraphLaunch(exec, other.s), cudaErrorStreamCaptureUnsupported)
      << "a graph launched inside a capture is not emulated";
  end_capture(other.s);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaEventDestroy(event);
}

}  // namespace
