#include "tensor/cuda/stream.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/device.h"

namespace loom::cuda {
namespace {

enum StreamKind { kCompute = 0, kComm = 1, kCopy = 2, kKinds = 3 };

// One slot per device and kind, filled on first use. Reads are lock-free; creation takes the
// mutex so that two threads never create two streams for one slot. Leaked on purpose
// (Note [Loom streams]).
struct StreamTable {
  explicit StreamTable(int devices) : slots(static_cast<size_t>(devices) * kKinds) {}
  std::mutex mutex;
  std::vector<std::atomic<cudaStream_t>> slots;
};

StreamTable& stream_table() {
  static StreamTable* table = new StreamTable(device_count());
  return *table;
}

cudaStream_t get_stream(int device, StreamKind kind) {
  check_device_index(device);
  StreamTable& table = stream_table();
  std::atomic<cudaStream_t>& slot = table.slots[static_cast<size_t>(device) * kKinds + kind];
  if (cudaStream_t stream = slot.load(std::memory_order_acquire)) return stream;
  std::lock_guard<std::mutex> lock(table.mutex);
  if (cudaStream_t stream = slot.load(std::memory_order_relaxed)) return stream;
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  slot.store(stream, std::memory_order_release);
  return stream;
}

// The calling thread's StreamGuard overrides, indexed by device.
struct Override {
  bool active = false;
  cudaStream_t stream = nullptr;
};

std::vector<Override>& thread_overrides() {
  thread_local std::vector<Override> overrides;
  return overrides;
}

int device_of_stream(cudaStream_t stream) {
  int device = -1;
  LOOM_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
  return device;
}

}  // namespace

cudaStream_t compute_stream(int device) {
  return get_stream(device, kCompute);
}

cudaStream_t comm_stream(int device) {
  return get_stream(device, kComm);
}

cudaStream_t copy_stream(int device) {
  return get_stream(device, kCopy);
}

cudaStream_t current_stream(int device) {
  const std::vector<Override>& overrides = thread_overrides();
  if (device >= 0 && static_cast<size_t>(device) < overrides.size() &&
      overrides[static_cast<size_t>(device)].active) {
    return overrides[static_cast<size_t>(device)].stream;
  }
  return compute_stream(device);
}

StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device) {
  check_device_index(device);
  std::vector<Override>& overrides = thread_overrides();
  if (overrides.size() <= static_cast<size_t>(device)) {
    overrides.resize(static_cast<size_t>(device) + 1);
  }
  Override& slot = overrides[static_cast<size_t>(device)];
  had_previous_ = slot.active;
  previous_ = slot.stream;
  slot = {true, stream};
}

StreamGuard::~StreamGuard() {
  // Normally the slot exists (the vector only grows); a guard ended on another thread than
  // the one that made it restores that thread's slot, which may need creating.
  std::vector<Override>& overrides = thread_overrides();
  if (overrides.size() <= static_cast<size_t>(device_)) {
    overrides.resize(static_cast<size_t>(device_) + 1);
  }
  overrides[static_cast<size_t>(device_)] = {had_previous_, previous_};
}

Event::Event(bool timing) : timing_(timing) {
  LOOM_CUDA_CHECK(cudaGetDevice(&device_));
  LOOM_CUDA_CHECK(
      cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  destroy();
}

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)),
      device_(other.device_),
      timing_(other.timing_),
      recorded_(std::exchange(other.recorded_, false)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    destroy();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
    timing_ = other.timing_;
    recorded_ = std::exchange(other.recorded_, false);
  }
  return *this;
}

void Event::destroy() noexcept {
  if (event_ != nullptr) {
    LOOM_CUDA_WARN(cudaEventDestroy(event_));
    event_ = nullptr;
  }
}

void Event::record(cudaStream_t stream) {
  check(event_ != nullptr, tag::kCuda.prefix() + "Event::record on a moved-from event");
  int stream_device = device_of_stream(stream);
  if (stream_device != device_) {
    // An event can only be recorded on streams of the device it was created on.
    DeviceGuard guard(stream_device);
    cudaEvent_t fresh = nullptr;
    LOOM_CUDA_CHECK(
        cudaEventCreateWithFlags(&fresh, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    destroy();
    event_ = fresh;
    device_ = stream_device;
  }
  LOOM_CUDA_CHECK(cudaEventRecord(event_, stream));
  recorded_ = true;
}

bool Event::query() const {
  if (!recorded_) return true;
  cudaError_t status = cudaEventQuery(event_);
  if (status == cudaSuccess) return true;
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return false;
  }
  LOOM_CUDA_CHECK(status);
  return false;
}

void Event::synchronize() const {
  if (recorded_) LOOM_CUDA_CHECK(cudaEventSynchronize(event_));
}

void Event::wait_on(cudaStream_t stream) const {
  if (recorded_) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0));
}

float Event::elapsed_ms(const Event& end) const {
  if (!timing_ || !end.timing_) {
    tag::kCuda.fail("Event::elapsed_ms needs two timing events (construct with Event(true))");
  }
  if (!recorded_ || !end.recorded_) {
    tag::kCuda.fail("Event::elapsed_ms needs both events recorded first");
  }
  float ms = 0;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, event_, end.event_));
  return ms;
}

}  // namespace loom::cuda
