// Stream capture and CUDA Graphs on the emulated device (Note [Emulated graphs] in
// stream_capture.h): the runtime calls that begin and end a capture, instantiate, launch and
// destroy its graph, and the capture state the other runtime calls consult.

#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "emulator.h"
#include "late_copies.h"
#include "stream_capture.h"

namespace loom::cuda_emulation {
namespace {

struct Node {
  WorkKind kind;
  std::string name;
  std::function<void()> work;
  ArgumentWords words;
};
using Nodes = std::vector<Node>;

struct Capture {
  cudaStreamCaptureMode mode;
  std::thread::id thread;
  bool invalidated = false;
  Nodes nodes;
};

// What cudaGraph_t and cudaGraphExec_t point at.
struct Graph {
  Nodes nodes;
};
struct GraphExec {
  std::shared_ptr<const Nodes> nodes;
};

std::mutex capture_mutex;
std::map<cudaStream_t, Capture>& captures() {
  static std::map<cudaStream_t, Capture> map;
  return map;
}
// Events whose last record was in a capture, with the capturing stream.
std::map<cudaEvent_t, cudaStream_t>& captured_events() {
  static std::map<cudaEvent_t, cudaStream_t> map;
  return map;
}
thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;

// True when the calling thread may not make a potentially unsafe call because of `capture`
// (the rules of cudaThreadExchangeStreamCaptureMode).
bool prohibits(const Capture& capture) {
  if (capture.mode == cudaStreamCaptureModeRelaxed) return false;
  const bool local = capture.thread == std::this_thread::get_id();
  switch (thread_mode) {
    case cudaStreamCaptureModeGlobal:
      return local || capture.mode == cudaStreamCaptureModeGlobal;
    case cudaStreamCaptureModeThreadLocal:
      return local;
    default:
      return false;
  }
}

// Adds the work to `stream`'s capture, if it captures: true, with `refused` set to what the
// capture says. False when the stream does not capture.
bool captured(cudaStream_t stream, WorkKind kind, const char* name, std::function<void()>& work,
              ArgumentWords& words, cudaError_t& refused) {
  std::lock_guard<std::mutex> lock(capture_mutex);
  auto it = captures().find(stream);
  if (it == captures().end()) return false;
  refused = cudaSuccess;
  if (it->second.invalidated) {
    refused = cudaErrorStreamCaptureInvalidated;
  } else {
    it->second.nodes.push_back(Node{kind, name, std::move(work), std::move(words)});
  }
  return true;
}

}  // namespace

cudaError_t submit(cudaStream_t stream, WorkKind kind, const char* name,
                   std::function<void()> work, ArgumentWords words) {
  cudaError_t refused = cudaSuccess;
  if (captured(stream, kind, name, work, words, refused)) return refused;
  land_copies(stream);  // the stream's earlier copies come first
  record_work(kind, name, /*replayed=*/false, words, stream);
  work();
  return cudaSuccess;
}

cudaError_t submit_landing_late(cudaStream_t stream, const char* name, std::function<void()> copy,
                                ArgumentWords words) {
  cudaError_t refused = cudaSuccess;
  if (captured(stream, WorkKind::kCopy, name, copy, words, refused)) return refused;
  land_copies(stream);
  record_work(WorkKind::kCopy, name, /*replayed=*/false, words, stream);
  defer_copy(stream, std::move(copy));
  return cudaSuccess;
}

cudaError_t check_unsafe_call_allowed() {
  std::lock_guard<std::mutex> lock(capture_mutex);
  bool refused = false;
  for (auto& [stream, capture] : captures()) {
    if (!prohibits(capture)) continue;
    capture.invalidated = true;
    refused = true;
  }
  return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t check_stream_not_capturing(cudaStream_t stream) {
  {
    std::lock_guard<std::mutex> lock(capture_mutex);
    auto it = captures().find(stream);
    if (it != captures().end()) {
      it->second.invalidated = true;
      return cudaErrorStreamCaptureUnsupported;
    }
  }
  return check_unsafe_call_allowed();
}

void note_event_record(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(capture_mutex);
  if (captures().count(stream) != 0)
    captured_events()[event] = stream;
  else
    captured_events().erase(event);
}

cudaError_t check_event_wait(cudaStream_t stream, cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(capture_mutex);
  auto it = captured_events().find(event);
  return it == captured_events().end() || it->second == stream ? cudaSuccess
                                                                : cudaErrorStreamCaptureIsolation;
}

void forget_event(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(capture_mutex);
  captured_events().erase(event);
}

}  // namespace loom::cuda_emulation

namespace emu = loom::cuda_emulation;

extern "C" {

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (stream == nullptr) return cudaErrorStreamCaptureUnsupported;  // the legacy stream
  std::lock_guard<std::mutex> lock(emu::capture_mutex);
  if (emu::captures().count(stream) != 0) return cudaErrorIllegalState;
  emu::captures().emplace(stream, emu::Capture{mode, std::this_thread::get_id(), false, {}});
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (graph == nullptr) return cudaErrorInvalidValue;
  *graph = nullptr;
  std::lock_guard<std::mutex> lock(emu::capture_mutex);
  auto it = emu::captures().find(stream);
  if (it == emu::captures().end()) return cudaErrorIllegalState;
  if (it->second.mode != cudaStreamCaptureModeRelaxed &&
      it->second.thread != std::this_thread::get_id())
    return cudaErrorStreamCaptureWrongThread;
  emu::Capture capture = std::move(it->second);
  emu::captures().erase(it);
  if (capture.invalidated) return cudaErrorStreamCaptureInvalidated;
  *graph = reinterpret_cast<cudaGraph_t>(new emu::Graph{std::move(capture.nodes)});
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus* status) {
  if (status == nullptr) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(emu::capture_mutex);
  auto it = emu::captures().find(stream);
  *status = it == emu::captures().end() ? cudaStreamCaptureStatusNone
            : it->second.invalidated    ? cudaStreamCaptureStatusInvalidated
                                        : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return cudaErrorInvalidValue;
  std::swap(*mode, emu::thread_mode);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                           unsigned long long) {
  if (exec == nullptr || graph == nullptr) return cudaErrorInvalidValue;
  const auto& nodes = reinterpret_cast<emu::Graph*>(graph)->nodes;
  *exec = reinterpret_cast<cudaGraphExec_t>(
      new emu::GraphExec{std::make_shared<const emu::Nodes>(nodes)});
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return cudaErrorInvalidValue;
  {
    std::lock_guard<std::mutex> lock(emu::capture_mutex);
    if (emu::captures().count(stream) != 0) return cudaErrorStreamCaptureUnsupported;
  }
  emu::land_all_copies();
  emu::record_work(emu::WorkKind::kGraph, "cudaGraphLaunch", false, {}, stream);
  for (const emu::Node& node : *reinterpret_cast<emu::GraphExec*>(exec)->nodes) {
    if (emu::device_error() != cudaSuccess) break;  // a trapped kernel ends the launch
    emu::record_work(node.kind, node.name.c_str(), /*replayed=*/true, node.words, stream);
    node.work();
  }
  return emu::device_error();
}

cudaError_t CUDARTAPI cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (exec == nullptr) return cudaErrorInvalidValue;
  delete reinterpret_cast<emu::GraphExec*>(exec);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGraphDestroy(cudaGraph_t graph) {
  if (graph == nullptr) return cudaErrorInvalidValue;
  delete reinterpret_cast<emu::Graph*>(graph);
  return cudaSuccess;
}

}  // extern "C"
