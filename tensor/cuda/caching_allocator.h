#pragma once
// The CUDA caching allocator: loom::Allocator for cuda:N.
//
// Note [Caching allocator]
// cudaMalloc and cudaFree are slow and cudaFree synchronises the device, so device memory is
// obtained in segments and cached. A segment is carved into blocks; freed blocks go back to
// per-device free sets and are handed out again without touching the driver.
//  - Sizes are rounded up to multiples of 512 B.
//  - Requests up to 1 MiB come from the small pool, whose segments are 2 MiB. Larger requests
//    come from the large pool: segments of 20 MiB for requests under 10 MiB, otherwise the
//    request rounded up to 2 MiB. The pools never lend to each other, so small, short-lived
//    tensors do not fragment the segments of big ones.
//  - A request takes the smallest free block that fits (best fit). When the rest of the block
//    is worth keeping (>= 512 B in the small pool, > 1 MiB in the large pool), the block is
//    split and the rest stays free. A freed block merges with free neighbours of its segment.
//  - Stream ordering: a block belongs to the stream it was allocated on and is only reused for
//    that stream. Freeing needs no synchronisation because any later user on the same stream
//    runs after the work that used the block. When a block is also used on other streams
//    (record_stream), its free records an event on each of them and the block only becomes
//    reusable once those events completed (polled on the next allocate or empty_cache).
//  - On out-of-memory, cached unused segments are returned to the driver and the cudaMalloc is
//    retried once; if that fails too, loom::Error reports the request and the allocator's
//    state.
// Cached segments stay reserved until empty_cache(). All driver calls go through
// DeviceMemoryDriver, so the bookkeeping is tested on machines without a GPU.
//
// Note [Private pools for graph capture]
// A captured CUDA graph (tensor/cuda/graph.h) replays its kernels on the addresses they had at
// capture, so memory the capture allocated must never be handed to anything else while the
// graph may replay, even after the capture freed it. Between begin_capture(stream) and
// end_capture(), allocations for the capturing stream come from a private pool: segments of
// their own, whose blocks, when freed (during the capture or after it), return to that pool
// and are only handed out again to the same capture. release_pool() (the graph is gone) merges
// the pool's segments into the shared cache. While a capture is under way the allocator makes
// none of the calls CUDA refuses during one: it does not query events and does not return
// segments to the driver (so out of memory fails without releasing the cache), and it
// allocates segments with the thread's capture mode relaxed, as PyTorch's does.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>

#include "tensor/allocator.h"

namespace loom::cuda {

// A driver event as the caching allocator sees it (a cudaEvent_t for the real driver).
using EventHandle = void*;

// A private pool of Note [Private pools for graph capture]; 0 is the shared cache.
using PoolId = uint64_t;

// The driver calls of one device's caching allocator. Every call is made with the
// allocator's lock held, so implementations need not be thread-safe.
class DeviceMemoryDriver {
 public:
  virtual ~DeviceMemoryDriver() = default;
  // `nbytes` of device memory, or nullptr when the device is out of memory; other failures
  // throw loom::Error.
  virtual void* malloc(size_t nbytes) = 0;
  virtual void free(void* ptr) = 0;
  // Captures the work queued on `stream` so far.
  virtual EventHandle record_event(cudaStream_t stream) = 0;
  // True when the captured work has finished; never blocks.
  virtual bool event_done(EventHandle event) = 0;
  virtual void destroy_event(EventHandle event) = 0;
  // The stream that Allocator::allocate() allocates for (cuda::current_stream(device)).
  virtual cudaStream_t current_stream() = 0;
};

// The driver backed by the CUDA runtime for `device`. Makes no CUDA call until used.
std::unique_ptr<DeviceMemoryDriver> make_cuda_memory_driver(int device);

// Byte counts are of rounded blocks and segments, so they can exceed the requested bytes
// that loom::MemoryStats (Allocator::stats()) counts.
struct CachingStats {
  size_t allocated_bytes = 0;       // in blocks handed out and not yet freed
  size_t reserved_bytes = 0;        // in segments obtained from the driver and not returned
  size_t peak_allocated_bytes = 0;  // maxima since start or reset_peak_stats()
  size_t peak_reserved_bytes = 0;
  size_t device_mallocs = 0;  // successful driver mallocs (segments created)
  size_t device_frees = 0;    // segments returned to the driver
  size_t cache_hits = 0;      // allocations served from a cached block, without the driver
};

class CachingAllocator final : public Allocator {
 public:
  CachingAllocator(int device, std::unique_ptr<DeviceMemoryDriver> driver);
  // Returns every segment to the driver, including blocks still handed out (their owners
  // must be gone by now). The per-device instances are never destroyed.
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // allocate_on(nbytes, driver->current_stream()).
  void* allocate(size_t nbytes) override;
  // Memory for `nbytes` (nullptr for 0) that is ready for use by work on `stream`.
  // Throws loom::Error when the device is out of memory even after releasing the cache.
  void* allocate_on(size_t nbytes, cudaStream_t stream);
  // Returns the block to the cache. Work already queued on the block's stream may still use
  // it (stream ordering); work on other streams must have been declared with record_stream.
  void deallocate(void* ptr, size_t nbytes) noexcept override;

  // Declares that work on `stream` uses the block at `ptr` (a pointer returned by allocate),
  // so that its free waits for that work. Throws loom::Error for an unknown pointer.
  void record_stream(void* ptr, cudaStream_t stream);
  // True when `ptr` is a block handed out by this allocator and not yet freed.
  bool owns(const void* ptr) const;
  // The allocation `ptr` points into (its start, and the bytes asked of allocate for it), or
  // none where `ptr` is in no block handed out and not yet freed, or past the bytes asked.
  // Walks every block: for tools and tests, such as the emulated device's accounting of the
  // bytes a launch's arguments name (tests/cuda_emulation/runtime/work_log.h).
  struct Allocation {
    const void* base;
    size_t bytes;
  };
  std::optional<Allocation> allocation_containing(const void* ptr) const;
  // Returns cached segments without allocated blocks to the driver. Throws loom::Error during
  // a capture (returning memory to the driver is not permitted then).
  void empty_cache();

  // Note [Private pools for graph capture]. begin_capture routes the allocations for `stream`
  // to a new private pool and returns it; throws loom::Error when a capture is under way.
  PoolId begin_capture(cudaStream_t stream);
  // Ends the routing; the pool stays private until release_pool.
  void end_capture();
  // Merges the pool's segments, with any blocks still handed out, into the shared cache.
  void release_pool(PoolId pool);

  CachingStats caching_stats() const;
  // Sets the peaks of caching_stats() and of Allocator::stats() to the current values.
  void reset_peak_stats();
  int device() const { return device_; }

 private:
  struct Block;
  struct BlockOrder {
    bool operator()(const Block* a, const Block* b) const;
  };
  using FreeSet = std::set<Block*, BlockOrder>;

  struct FreeSets {
    FreeSet small;
    FreeSet large;
  };

  Block* find_free_block(FreeSet& pool, size_t size, cudaStream_t stream);
  Block* create_segment(size_t requested, size_t size, cudaStream_t stream, bool small,
                        PoolId pool);
  void split(Block* block, size_t size);
  void free_block(Block* block);
  void process_events();
  void release_cached_segments();
  FreeSet& pool_of(const Block* block);
  [[noreturn]] void fail_out_of_memory(size_t requested, size_t segment);

  const int device_;
  std::unique_ptr<DeviceMemoryDriver> driver_;
  FreeSets& free_sets_of(PoolId pool);

  mutable std::mutex mutex_;
  FreeSets shared_free_;
  std::unordered_map<PoolId, FreeSets> private_free_;  // by pool
  PoolId capture_pool_ = 0;                  // the pool being captured into, or 0
  cudaStream_t capture_stream_ = nullptr;    // its stream
  PoolId last_pool_ = 0;
  std::unordered_map<const void*, Block*> active_;             // handed-out blocks by pointer
  std::unordered_map<const void*, Block*> segments_;           // first block of each segment
  std::deque<std::pair<EventHandle, Block*>> pending_events_;  // freed, awaiting other streams
  CachingStats stats_;
};

// The caching allocator of cuda:`device`, created on first use and never destroyed (the
// driver may be gone at exit). Throws loom::Error for an index outside 0..device_count()-1.
CachingAllocator& caching_allocator(int device);
// CachingAllocator::record_stream on the device allocator that handed out `ptr`.
void record_stream(void* ptr, cudaStream_t stream);
// CachingAllocator::empty_cache on every device allocator created so far.
void empty_cache();
CachingStats caching_stats(int device);
void reset_peak_stats(int device);

}  // namespace loom::cuda
