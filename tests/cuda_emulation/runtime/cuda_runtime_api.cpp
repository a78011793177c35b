// The part of the CUDA runtime API that Loom's kernel launchers call, answered by the
// emulator: a program built with it does not link libcudart, so a call the emulation does
// not provide is a link error rather than a silent "no device".
//
// Memory is the host's: a "device pointer" is a host pointer, and copies are memcpy. Work is
// done when it is issued (every launch runs to completion before returning), so the
// synchronising calls only report the error a trapped kernel left, unless a stream capture
// refuses them (Note [Emulated graphs] in stream_capture.h); work issued to a capturing
// stream is recorded instead.

#include <cuda_runtime_api.h>

#include <cstring>
#include <functional>
#include <map>
#include <mutex>

#include "emulator.h"
#include "late_copies.h"
#include "stream_capture.h"
#include "stream_order.h"
#include "work_log.h"

namespace loom::cuda_emulation {

extern cudaError_t emulated_last_error;

namespace {

constexpr size_t kDefaultDynamicShared = 48 * 1024;
constexpr size_t kOptInDynamicShared = 227 * 1024;  // sm_90's per-block opt-in limit

std::mutex attribute_mutex;
std::map<const void*, size_t>& dynamic_shared_limits() {
  static std::map<const void*, size_t> limits;
  return limits;
}

}  // namespace

size_t max_dynamic_shared_bytes(const void* kernel) {
  std::lock_guard<std::mutex> lock(attribute_mutex);
  auto it = dynamic_shared_limits().find(kernel);
  return it == dynamic_shared_limits().end() ? kDefaultDynamicShared : it->second;
}

}  // namespace loom::cuda_emulation

using loom::cuda_emulation::emulated_last_error;

namespace {

cudaMemoryType memory_type(const void* p) {
  cudaPointerAttributes attributes{};
  return cudaPointerGetAttributes(&attributes, p) == cudaSuccess ? attributes.type
                                                                 : cudaMemoryTypeUnregistered;
}

enum class CopyCall { kLinear, k2D };

// The copy's name in the WorkLog, by its call and where its pointers are (cudaMemcpyDefault's
// way).
const char* copy_name(CopyCall call, cudaMemoryType to, cudaMemoryType from) {
  static constexpr const char* kNames[2][2][2] = {
      {{"cudaMemcpyAsync host to host", "cudaMemcpyAsync host to device"},
       {"cudaMemcpyAsync device to host", "cudaMemcpyAsync device to device"}},
      {{"cudaMemcpy2DAsync host to host", "cudaMemcpy2DAsync host to device"},
       {"cudaMemcpy2DAsync device to host", "cudaMemcpy2DAsync device to device"}}};
  return kNames[call == CopyCall::k2D][from == cudaMemoryTypeDevice][to == cudaMemoryTypeDevice];
}

// Issues `copy` (dst <- src) on `stream`, named by its call and direction; between device and
// page-locked host memory on a stream it lands late (Note [Copies to and from pinned memory
// land late]).
cudaError_t submit_copy(CopyCall call, void* dst, const void* src, cudaStream_t stream,
                        std::function<void()> copy) {
  const cudaMemoryType to = memory_type(dst), from = memory_type(src);
  const bool late =
      stream != nullptr && ((to == cudaMemoryTypeDevice && from == cudaMemoryTypeHost) ||
                            (to == cudaMemoryTypeHost && from == cudaMemoryTypeDevice));
  const char* name = copy_name(call, to, from);
  const cudaError_t refused =
      late ? loom::cuda_emulation::submit_landing_late(stream, name, std::move(copy),
                                                       {{dst, false}, {src, true}})
           : loom::cuda_emulation::submit(stream, loom::cuda_emulation::WorkKind::kCopy, name,
                                          std::move(copy), {{dst, false}, {src, true}});
  return refused != cudaSuccess ? refused : loom::cuda_emulation::device_error();
}

}  // namespace

extern "C" {

cudaError_t CUDARTAPI cudaGetLastError(void) {
  const cudaError_t error = emulated_last_error;
  emulated_last_error = loom::cuda_emulation::device_error();  // a trap's error is sticky
  return error;
}

cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return emulated_last_error; }

const char* CUDARTAPI cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaError (emulated)";
  }
}

const char* CUDARTAPI cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorIllegalState: return "the operation is not permitted in the current state";
    default: return "an error the emulated runtime does not name";
  }
}

cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  if (attr == nullptr || func == nullptr) return cudaErrorInvalidValue;
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = 1024;
  attr->maxDynamicSharedSizeBytes =
      static_cast<int>(loom::cuda_emulation::max_dynamic_shared_bytes(func));
  attr->ptxVersion = 90;  // the emulated build targets sm_90, as the real one does
  attr->binaryVersion = 90;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr,
                                           int value) {
  if (func == nullptr) return cudaErrorInvalidValue;
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || static_cast<size_t>(value) > loom::cuda_emulation::kOptInDynamicShared)
    return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lock(loom::cuda_emulation::attribute_mutex);
  loom::cuda_emulation::dynamic_shared_limits()[func] = static_cast<size_t>(value);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t count,
                                      enum cudaMemcpyKind, cudaStream_t stream) {
  if (count > 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  return submit_copy(CopyCall::kLinear, dst, src, stream, [=] {
    if (count > 0) std::memmove(dst, src, count);
  });
}

cudaError_t CUDARTAPI cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind,
                                        cudaStream_t stream) {
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  if (height > 0 && width > 0 && (dst == nullptr || src == nullptr)) return cudaErrorInvalidValue;
  return submit_copy(CopyCall::k2D, dst, src, stream, [=] {
    for (size_t row = 0; row < height; ++row)
      std::memmove(static_cast<char*>(dst) + row * dpitch,
                   static_cast<const char*>(src) + row * spitch, width);
  });
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  if (count > 0 && ptr == nullptr) return cudaErrorInvalidValue;
  const cudaError_t refused =
      loom::cuda_emulation::submit(stream, loom::cuda_emulation::WorkKind::kFill, "cudaMemsetAsync",
                                   [=] {
                                     if (count > 0) std::memset(ptr, value, count);
                                   },
                                   {{ptr, false}});
  return refused != cudaSuccess ? refused : loom::cuda_emulation::device_error();
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  const cudaError_t refused = loom::cuda_emulation::check_stream_not_capturing(stream);
  if (refused != cudaSuccess) return refused;
  loom::cuda_emulation::land_all_copies();
  loom::cuda_emulation::record_work(loom::cuda_emulation::WorkKind::kSync, "cudaStreamSynchronize",
                                    false, {}, stream);
  loom::cuda_emulation::note_host_waited_for_stream(stream);
  return loom::cuda_emulation::device_error();
}

cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  const cudaError_t refused = loom::cuda_emulation::check_unsafe_call_allowed();
  if (refused != cudaSuccess) return refused;
  loom::cuda_emulation::land_all_copies();
  loom::cuda_emulation::record_work(loom::cuda_emulation::WorkKind::kSync, "cudaDeviceSynchronize");
  loom::cuda_emulation::note_host_waited_for_device();
  return loom::cuda_emulation::device_error();
}

}  // extern "C"
