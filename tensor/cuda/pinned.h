#pragma once
// Page-locked ("pinned") host memory, from a process-wide cache.
//
// Pinned memory is what the GPU's copy engines read and write directly, so copies between it
// and the device can be asynchronous; pageable memory is staged through it (tensor/cuda/copy.h).
// cudaHostAlloc is slow (it maps the pages for every device), hence the cache: a released
// buffer is kept for the next request of the same size class (the size rounded up to a power
// of two, at least 4 KiB). Buffers are never shared: a released buffer that streams may still
// be using is held back until an event recorded on each of those streams at release completed.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace loom::cuda {

// At least `bytes` bytes of pinned host memory, usable with every device (portable).
// Move-only. Before the buffer is destroyed, every stream that was given work on it must be
// named with record_stream(), unless that work is known to be finished (for example after
// synchronising the stream); the buffer is then only reused after that work finished.
// Construction throws loom::Error when pinned memory cannot be had even after freeing the
// cache; destruction never throws. Thread-safe across buffers; one buffer is one thread's.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);  // 0 gives an empty buffer (get() == nullptr)
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Declares that work queued on `stream` uses the buffer (see the class comment).
  void record_stream(cudaStream_t stream);

 private:
  void release() noexcept;

  void* ptr_ = nullptr;
  size_t bytes_ = 0;     // as requested
  size_t capacity_ = 0;  // the cached block's size class
  std::vector<cudaStream_t> streams_;
};

struct PinnedStats {
  size_t in_use_bytes = 0;  // held by live PinnedBuffers or waiting for their streams
  size_t cached_bytes = 0;  // free for reuse
  size_t host_allocs = 0;   // cudaHostAlloc calls
  size_t cache_hits = 0;    // buffers served from the cache
};

PinnedStats pinned_stats();
// Frees cached pinned blocks that are not in use (cudaFreeHost).
void empty_pinned_cache();

}  // namespace loom::cuda
