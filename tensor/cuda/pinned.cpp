#include "tensor/cuda/pinned.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/device.h"

namespace loom::cuda {
namespace {

constexpr size_t kMinPinnedBlock = 4096;  // one page

size_t size_class(size_t bytes) {
  return std::bit_ceil(std::max(bytes, kMinPinnedBlock));
}

// The process-wide pinned cache. Leaked on purpose: freeing pinned memory at exit could run
// after the driver has shut down.
class PinnedCache {
 public:
  void* acquire(size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    poll_pending();
    auto it = free_.find(capacity);
    if (it != free_.end()) {
      void* ptr = it->second;
      free_.erase(it);
      stats_.cached_bytes -= capacity;
      stats_.in_use_bytes += capacity;
      ++stats_.cache_hits;
      return ptr;
    }
    void* ptr = host_alloc(capacity);
    if (ptr == nullptr) {
      free_cached();
      ptr = host_alloc(capacity);
    }
    if (ptr == nullptr) {
      tag::kCuda.fail("out of pinned host memory: cudaHostAlloc of ", capacity,
                      " bytes failed after freeing the pinned cache (", stats_.in_use_bytes,
                      " bytes of pinned memory are in use); stage less data at a time or raise the "
                      "locked-memory limit");
    }
    ++stats_.host_allocs;
    stats_.in_use_bytes += capacity;
    return ptr;
  }

  // Never throws: when an event cannot be recorded the block is leaked (reported), since
  // nothing would say when its streams are done with it.
  void release(void* ptr, size_t capacity, const std::vector<cudaStream_t>& streams) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    Pending pending{ptr, capacity, {}};
    try {
      for (cudaStream_t stream : streams)
        pending.events.push_back(record_on(stream));
    } catch (const std::exception& e) {
      std::fprintf(stderr,
                   "%swarning: could not record an event for a pinned buffer (%s); its %zu "
                   "bytes are not reused\n",
                   tag::kCuda.prefix().c_str(), e.what(), capacity);
      for (cudaEvent_t event : pending.events)
        LOOM_CUDA_WARN(cudaEventDestroy(event));
      return;
    }
    try {
      if (pending.events.empty()) {
        make_free(ptr, capacity);
      } else {
        pending_.push_back(std::move(pending));
      }
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "%swarning: pinned cache bookkeeping failed; block leaked\n",
                   tag::kCuda.prefix().c_str());
    }
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mutex_);
    poll_pending();
    free_cached();
  }

  PinnedStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  struct Pending {
    void* ptr;
    size_t capacity;
    std::vector<cudaEvent_t> events;  // one per stream that used the block
  };

  static void* host_alloc(size_t bytes) {
    void* ptr = nullptr;
    cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    LOOM_CUDA_CHECK(status);
    return ptr;
  }

  static cudaEvent_t record_on(cudaStream_t stream) {
    // An event must be created on the device of the stream it is recorded on.
    int device = -1;
    LOOM_CUDA_CHECK(cudaStreamGetDevice(stream, &device));
    DeviceGuard guard(device);
    cudaEvent_t event = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    cudaError_t status = cudaEventRecord(event, stream);
    if (status != cudaSuccess) {
      LOOM_CUDA_WARN(cudaEventDestroy(event));
      LOOM_CUDA_CHECK(status);
    }
    return event;
  }

  static bool done(cudaEvent_t event) {
    cudaError_t status = cudaEventQuery(event);
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    LOOM_CUDA_CHECK(status);
    return false;
  }

  void make_free(void* ptr, size_t capacity) {
    free_.emplace(capacity, ptr);
    stats_.in_use_bytes -= capacity;
    stats_.cached_bytes += capacity;
  }

  // Moves blocks whose streams have passed their release events to the free lists.
  void poll_pending() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      std::vector<cudaEvent_t>& events = it->events;
      while (!events.empty() && done(events.back())) {
        LOOM_CUDA_WARN(cudaEventDestroy(events.back()));
        events.pop_back();
      }
      if (!events.empty()) {
        ++it;
        continue;
      }
      make_free(it->ptr, it->capacity);
      it = pending_.erase(it);
    }
  }

  void free_cached() {
    for (auto it = free_.begin(); it != free_.end();) {
      LOOM_CUDA_CHECK(cudaFreeHost(it->second));
      stats_.cached_bytes -= it->first;
      it = free_.erase(it);
    }
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // size class -> block
  std::vector<Pending> pending_;
  PinnedStats stats_;
};

PinnedCache& pinned_cache() {
  static PinnedCache* cache = new PinnedCache();
  return *cache;
}

}  // namespace

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  capacity_ = size_class(bytes);
  ptr_ = pinned_cache().acquire(capacity_);
}

PinnedBuffer::~PinnedBuffer() {
  release();
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      streams_(std::move(other.streams_)) {
  other.streams_.clear();
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    streams_ = std::move(other.streams_);
    other.streams_.clear();
  }
  return *this;
}

void PinnedBuffer::record_stream(cudaStream_t stream) {
  if (ptr_ == nullptr) return;
  if (std::find(streams_.begin(), streams_.end(), stream) == streams_.end()) {
    streams_.push_back(stream);
  }
}

void PinnedBuffer::release() noexcept {
  if (ptr_ == nullptr) return;
  pinned_cache().release(ptr_, capacity_, streams_);
  ptr_ = nullptr;
  bytes_ = 0;
  capacity_ = 0;
  streams_.clear();
}

PinnedStats pinned_stats() {
  return pinned_cache().stats();
}

void empty_pinned_cache() {
  pinned_cache().empty();
}

}  // namespace loom::cuda

namespace loom {

void page_lock_host_memory(void* ptr, size_t nbytes) {
  if (ptr == nullptr || nbytes == 0) return;
  LOOM_CUDA_CHECK(cudaHostRegister(ptr, nbytes, cudaHostRegisterPortable));
}

void page_unlock_host_memory(void* ptr) noexcept {
  if (ptr != nullptr) LOOM_CUDA_WARN(cudaHostUnregister(ptr));
}

}  // namespace loom
