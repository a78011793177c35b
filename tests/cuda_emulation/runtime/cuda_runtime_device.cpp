// The CUDA runtime's device, memory, stream and event calls that Loom's device runtime
// (tensor/cuda/) makes, answered by the emulator, so that the whole tensor library runs on
// the emulated device (test_emulated_training.cpp). The rules of cuda_runtime_api.cpp hold:
// memory is the host's, work is done when it is issued.
//
// One device, 0. Device memory and pinned host memory are 256-byte aligned host allocations,
// told apart by cudaPointerGetAttributes as CUDA tells them apart; anything else is pageable
// host memory. Streams and events are tokens: every stream is always idle and every event
// always complete, since nothing is ever queued. While a stream captures, the calls CUDA
// calls potentially unsafe are refused as CUDA refuses them (Note [Emulated graphs]).

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>

#include "emulator.h"
#include "late_copies.h"
#include "stream_capture.h"
#include "stream_order.h"
#include "work_log.h"

namespace loom::cuda_emulation {
namespace {

constexpr std::align_val_t kAlignment{256};

std::mutex memory_mutex;

// Every live allocation and registered range, by its start: its size and what CUDA calls it.
struct Range {
  size_t bytes;
  cudaMemoryType type;
  bool owned;  // allocated here (freed by cudaFree/cudaFreeHost), not registered
};
std::map<const char*, Range>& ranges() {
  static std::map<const char*, Range> map;
  return map;
}

cudaError_t allocate(void** ptr, size_t bytes, cudaMemoryType type) {
  if (ptr == nullptr) return cudaErrorInvalidValue;
  *ptr = nullptr;
  if (const cudaError_t refused = check_unsafe_call_allowed(); refused != cudaSuccess)
    return refused;
  if (bytes == 0) return cudaSuccess;
  void* p = ::operator new(bytes, kAlignment, std::nothrow);
  if (p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(memory_mutex);
  ranges()[static_cast<const char*>(p)] = Range{bytes, type, true};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t release(void* ptr, cudaMemoryType type) {
  if (const cudaError_t refused = check_unsafe_call_allowed(); refused != cudaSuccess)
    return refused;
  if (ptr == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = ranges().find(static_cast<const char*>(ptr));
    if (it == ranges().end() || it->second.type != type || !it->second.owned)
      return cudaErrorInvalidValue;
    ranges().erase(it);
  }
  ::operator delete(ptr, kAlignment);
  return cudaSuccess;
}

// The kind of the range holding ptr, or cudaMemoryTypeUnregistered.
cudaMemoryType type_of(const void* ptr) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  const char* p = static_cast<const char*>(ptr);
  auto it = ranges().upper_bound(p);
  if (it == ranges().begin()) return cudaMemoryTypeUnregistered;
  --it;
  return p < it->first + it->second.bytes ? it->second.type : cudaMemoryTypeUnregistered;
}

struct Token {};  // what an emulated stream or event handle points at

}  // namespace
}  // namespace loom::cuda_emulation

namespace emu = loom::cuda_emulation;

extern "C" {

cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (count == nullptr) return cudaErrorInvalidValue;
  *count = 1;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t CUDARTAPI cudaMalloc(void** ptr, size_t size) {
  return emu::allocate(ptr, size, cudaMemoryTypeDevice);
}

cudaError_t CUDARTAPI cudaFree(void* ptr) {
  emu::land_all_copies();  // a pending copy may read or write the memory
  return emu::release(ptr, cudaMemoryTypeDevice);
}

cudaError_t CUDARTAPI cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  return emu::allocate(ptr, size, cudaMemoryTypeHost);
}

cudaError_t CUDARTAPI cudaFreeHost(void* ptr) {
  emu::land_all_copies();
  return emu::release(ptr, cudaMemoryTypeHost);
}

cudaError_t CUDARTAPI cudaHostRegister(void* ptr, size_t size, unsigned int) {
  if (ptr == nullptr || size == 0) return cudaErrorInvalidValue;
  if (const cudaError_t refused = emu::check_unsafe_call_allowed(); refused != cudaSuccess)
    return refused;
  if (emu::type_of(ptr) != cudaMemoryTypeUnregistered) return cudaErrorHostMemoryAlreadyRegistered;
  std::lock_guard<std::mutex> lock(emu::memory_mutex);
  emu::ranges()[static_cast<const char*>(ptr)] = emu::Range{size, cudaMemoryTypeHost, false};
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaHostUnregister(void* ptr) {
  emu::land_all_copies();
  if (const cudaError_t refused = emu::check_unsafe_call_allowed(); refused != cudaSuccess)
    return refused;
  std::lock_guard<std::mutex> lock(emu::memory_mutex);
  auto it = emu::ranges().find(static_cast<const char*>(ptr));
  if (it == emu::ranges().end() || it->second.owned) return cudaErrorHostMemoryNotRegistered;
  emu::ranges().erase(it);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaPointerGetAttributes(struct cudaPointerAttributes* attributes,
                                               const void* ptr) {
  if (attributes == nullptr) return cudaErrorInvalidValue;
  *attributes = cudaPointerAttributes{};
  attributes->type = emu::type_of(ptr);
  attributes->device = 0;
  if (attributes->type == cudaMemoryTypeDevice) attributes->devicePointer = const_cast<void*>(ptr);
  if (attributes->type == cudaMemoryTypeHost) attributes->hostPointer = const_cast<void*>(ptr);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind) {
  if (const cudaError_t refused = emu::check_unsafe_call_allowed(); refused != cudaSuccess)
    return refused;
  const cudaError_t status = cudaMemcpyAsync(dst, src, count, cudaMemcpyDefault, nullptr);
  emu::note_host_waited_for_stream(nullptr);  // done when issued, and waited for
  return status;
}

cudaError_t CUDARTAPI cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src,
                                          int src_device, size_t count, cudaStream_t stream) {
  if (dst_device != 0 || src_device != 0) return cudaErrorInvalidDevice;
  return cudaMemcpyAsync(dst, src, count, cudaMemcpyDefault, stream);
}

cudaError_t CUDARTAPI cudaMemset2DAsync(void* ptr, size_t pitch, int value, size_t width,
                                        size_t height, cudaStream_t stream) {
  if (width > pitch) return cudaErrorInvalidPitchValue;
  if (height > 0 && width > 0 && ptr == nullptr) return cudaErrorInvalidValue;
  const cudaError_t refused =
      emu::submit(stream, emu::WorkKind::kFill, "cudaMemset2DAsync",
                  [=] {
                    for (size_t row = 0; row < height; ++row)
                      std::memset(static_cast<char*>(ptr) + row * pitch, value, width);
                  },
                  {{ptr, false}});
  return refused != cudaSuccess ? refused : emu::device_error();
}

cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (stream == nullptr) return cudaErrorInvalidValue;
  *stream = reinterpret_cast<cudaStream_t>(new emu::Token);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream) {
  delete reinterpret_cast<emu::Token*>(stream);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamGetDevice(cudaStream_t, int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  const cudaError_t status = emu::check_event_wait(stream, event);
  if (status != cudaSuccess) return status;
  emu::land_all_copies();
  emu::note_stream_waits(stream, event);
  return status;
}

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  const cudaError_t refused = emu::check_stream_not_capturing(stream);
  if (refused != cudaSuccess) return refused;
  emu::land_all_copies();
  emu::note_host_waited_for_stream(stream);  // it answers complete
  return emu::device_error();
}

cudaError_t CUDARTAPI cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  if (event == nullptr) return cudaErrorInvalidValue;
  *event = reinterpret_cast<cudaEvent_t>(new emu::Token);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  emu::forget_event(event);
  delete reinterpret_cast<emu::Token*>(event);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  emu::note_event_record(event, stream);
  emu::note_event_recorded(event, stream);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  const cudaError_t refused = emu::check_unsafe_call_allowed();
  if (refused != cudaSuccess) return refused;
  emu::land_all_copies();
  emu::note_host_waited_for_event(event);  // it answers complete
  return emu::device_error();
}

cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t event) {
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaSuccess) emu::record_work(emu::WorkKind::kSync, "cudaEventSynchronize");
  return status;
}

// No time passes on the emulated device.
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return cudaErrorInvalidValue;
  *ms = 0.0f;
  return cudaSuccess;
}

}  // extern "C"
