#include "fake_cuda_driver.h"

// Streams and events of the fake devices. A stream counts the work issued and finished; an
// event remembers the stream it captured and how much work had been issued there.
struct CUstream_st {
  int device;
  unsigned flags;
  uint64_t issued = 0, finished = 0;
};
struct CUevent_st {
  int device;
  unsigned flags;
  CUstream_st* stream = nullptr;
  uint64_t position = 0;
};

namespace loom::fake_cuda {
namespace {
Counts tally;
thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t failed(cudaError_t error) {
  last_error = error;
  return error;
}
}  // namespace

void enqueue(cudaStream_t stream) { ++stream->issued; }
void finish(cudaStream_t stream) { stream->finished = stream->issued; }
const Counts& counts() { return tally; }
unsigned stream_flags(cudaStream_t stream) { return stream->flags; }

}  // namespace loom::fake_cuda

using namespace loom::fake_cuda;

extern "C" {

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  *count = kDevices;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  if (device < 0 || device >= kDevices) return failed(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaGetLastError(void) {
  const cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaError (fake)";
  }
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) { return cudaGetErrorName(error); }

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  ++tally.streams_created;
  *stream = new CUstream_st{current_device, flags};
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (stream == nullptr) return failed(cudaErrorInvalidResourceHandle);
  *device = stream->device;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  ++tally.events_created;
  *event = new CUevent_st{current_device, flags};
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  ++tally.events_destroyed;
  delete event;
  return cudaSuccess;
}

// As CUDA: an event can only capture a stream of the device it was created on.
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr || stream == nullptr || event->device != stream->device)
    return failed(cudaErrorInvalidResourceHandle);
  event->stream = stream;
  event->position = stream->issued;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  if (event->stream == nullptr || event->stream->finished >= event->position) return cudaSuccess;
  return failed(cudaErrorNotReady);
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  if (event->stream != nullptr && event->stream->finished < event->position)
    event->stream->finished = event->position;  // the host waited until then
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (stream == nullptr || event == nullptr) return failed(cudaErrorInvalidResourceHandle);
  ++tally.stream_waits;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if ((start->flags & cudaEventDisableTiming) != 0 || (end->flags & cudaEventDisableTiming) != 0)
    return failed(cudaErrorInvalidResourceHandle);
  *ms = 1.5f;
  return cudaSuccess;
}

}  // extern "C"
