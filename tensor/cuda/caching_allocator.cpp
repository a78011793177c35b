#include "tensor/cuda/caching_allocator.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cuda/capture_mode.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/stream.h"

namespace loom::cuda {
namespace {

// Sizes of Note [Caching allocator].
constexpr size_t kMinBlockSize = 512;        // rounding unit and smallest block
constexpr size_t kSmallSize = 1 << 20;       // largest request of the small pool
constexpr size_t kSmallSegment = 2 << 20;    // segment size of the small pool
constexpr size_t kMinLargeAlloc = 10 << 20;  // requests below this share 20 MiB segments
constexpr size_t kLargeSegment = 20 << 20;
constexpr size_t kLargeRounding = 2 << 20;  // bigger requests get their own segment
// No device has this much memory; the bound keeps the rounding below from overflowing.
constexpr size_t kMaxRequest = std::numeric_limits<size_t>::max() / 4;

size_t round_up(size_t n, size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

size_t round_size(size_t nbytes) {
  return nbytes < kMinBlockSize ? kMinBlockSize : round_up(nbytes, kMinBlockSize);
}

size_t segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallSegment;
  if (rounded < kMinLargeAlloc) return kLargeSegment;
  return round_up(rounded, kLargeRounding);
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

}  // namespace

struct CachingAllocator::Block {
  Block(char* ptr_, size_t size_, cudaStream_t stream_, bool small_, PoolId pool_)
      : ptr(ptr_), size(size_), stream(stream_), small(small_), pool(pool_) {}

  char* ptr;
  size_t size;
  cudaStream_t stream;  // the only stream the block is handed out for
  bool small;           // which pool
  PoolId pool;          // its segment's private pool, or 0 (the shared cache)
  bool allocated = false;
  size_t requested = 0;    // the bytes asked of allocate_on (size is rounded up), while allocated
  int pending_events = 0;  // events recorded at free that have not completed yet
  Block* prev = nullptr;   // neighbours within the segment, by address
  Block* next = nullptr;
  std::set<cudaStream_t> stream_uses;  // other streams that used it (record_stream)
};

// Free sets are ordered by stream, then size, then address: lower_bound on (stream, size)
// finds the best fit for that stream.
bool CachingAllocator::BlockOrder::operator()(const Block* a, const Block* b) const {
  auto stream_a = reinterpret_cast<uintptr_t>(a->stream);
  auto stream_b = reinterpret_cast<uintptr_t>(b->stream);
  if (stream_a != stream_b) return stream_a < stream_b;
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

CachingAllocator::CachingAllocator(int device, std::unique_ptr<DeviceMemoryDriver> driver)
    : device_(device), driver_(std::move(driver)) {
  check(driver_ != nullptr, tag::kCuda.prefix() + "CachingAllocator needs a DeviceMemoryDriver");
}

CachingAllocator::~CachingAllocator() {
  try {
    for (auto& [event, block] : pending_events_)
      driver_->destroy_event(event);
    for (auto& [base, head] : segments_) {
      for (Block* block = head; block != nullptr;) {
        Block* next = block->next;
        delete block;
        block = next;
      }
      driver_->free(const_cast<void*>(base));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%swarning: cuda:%d caching allocator teardown failed: %s\n",
                 tag::kCuda.prefix().c_str(), device_, e.what());
  }
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  return allocate_on(nbytes, driver_->current_stream());
}

void* CachingAllocator::allocate_on(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  if (nbytes > kMaxRequest) {
    tag::kCuda.fail("cuda:", device_, " cannot allocate ", nbytes,
                    " bytes: larger than any device memory (a negative size converted to size_t?)");
  }
  size_t size = round_size(nbytes);
  bool small = size <= kSmallSize;
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_pool_ == 0) process_events();  // event queries are refused during a capture
  const PoolId pool = capture_pool_ != 0 && stream == capture_stream_ ? capture_pool_ : 0;
  FreeSets& free = free_sets_of(pool);
  Block* block = find_free_block(small ? free.small : free.large, size, stream);
  if (block != nullptr) {
    ++stats_.cache_hits;
  } else {
    block = create_segment(nbytes, size, stream, small, pool);
  }
  split(block, size);
  block->allocated = true;
  block->requested = nbytes;
  active_.emplace(block->ptr, block);
  stats_.allocated_bytes += block->size;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  record_allocation(nbytes);
  return block->ptr;
}

CachingAllocator::Block* CachingAllocator::find_free_block(FreeSet& pool, size_t size,
                                                           cudaStream_t stream) {
  Block key(nullptr, size, stream, false, 0);
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::create_segment(size_t requested, size_t size,
                                                          cudaStream_t stream, bool small,
                                                          PoolId pool) {
  size_t bytes = segment_size(size);
  void* ptr = driver_->malloc(bytes);
  if (ptr == nullptr && capture_pool_ == 0) {
    // Cached segments of other sizes or streams may be what is in the way (not during a
    // capture, which does not permit returning memory to the driver).
    release_cached_segments();
    ptr = driver_->malloc(bytes);
  }
  if (ptr == nullptr) fail_out_of_memory(requested, bytes);
  auto* block = new Block(static_cast<char*>(ptr), bytes, stream, small, pool);
  segments_.emplace(ptr, block);
  stats_.reserved_bytes += bytes;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.device_mallocs;
  return block;
}

// Splits `block` (handed out, in no free set) after `size` bytes when the rest is worth
// keeping; the rest becomes a free block of the same segment and stream.
void CachingAllocator::split(Block* block, size_t size) {
  size_t rest = block->size - size;
  bool worth_it = block->small ? rest >= kMinBlockSize : rest > kSmallSize;
  if (!worth_it) return;
  auto* remainder = new Block(block->ptr + size, rest, block->stream, block->small, block->pool);
  remainder->prev = block;
  remainder->next = block->next;
  if (block->next != nullptr) block->next->prev = remainder;
  block->next = remainder;
  block->size = size;
  pool_of(remainder).insert(remainder);
}

CachingAllocator::FreeSet& CachingAllocator::pool_of(const Block* block) {
  FreeSets& free = free_sets_of(block->pool);
  return block->small ? free.small : free.large;
}

CachingAllocator::FreeSets& CachingAllocator::free_sets_of(PoolId pool) {
  return pool == 0 ? shared_free_ : private_free_[pool];
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) noexcept {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  if (it == active_.end()) {
    std::fprintf(stderr,
                 "%swarning: cuda:%d caching allocator asked to free %p, which it did not "
                 "hand out (or which was already freed); ignored\n",
                 tag::kCuda.prefix().c_str(), device_, ptr);
    return;
  }
  Block* block = it->second;
  active_.erase(it);
  block->allocated = false;
  stats_.allocated_bytes -= block->size;
  record_deallocation(nbytes);
  if (!block->stream_uses.empty()) {
    try {
      for (cudaStream_t stream : block->stream_uses) {
        EventHandle event = driver_->record_event(stream);
        pending_events_.emplace_back(event, block);
        ++block->pending_events;
      }
      block->stream_uses.clear();
      return;  // process_events() frees it once every event completed
    } catch (const std::exception& e) {
      // Without the events nothing says when the other streams are done with the block:
      // keep it out of circulation for good rather than risk handing out memory in use.
      std::fprintf(stderr,
                   "%swarning: cuda:%d caching allocator could not record an event for a "
                   "block used on several streams (%s); its %zu bytes stay reserved\n",
                   tag::kCuda.prefix().c_str(), device_, e.what(), block->size);
      block->allocated = true;
      return;
    }
  }
  free_block(block);
}

// Returns a block that is neither handed out nor waiting for events to its pool, merged with
// its free neighbours.
void CachingAllocator::free_block(Block* block) {
  FreeSet& pool = pool_of(block);
  auto is_free = [](const Block* b) {
    return b != nullptr && !b->allocated && b->pending_events == 0;
  };
  if (is_free(block->prev)) {
    Block* prev = block->prev;  // prev absorbs block, so a segment's first block stays first
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next != nullptr) block->next->prev = prev;
    delete block;
    block = prev;
  }
  if (is_free(block->next)) {
    Block* next = block->next;
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    delete next;
  }
  pool.insert(block);
}

void CachingAllocator::process_events() {
  for (auto it = pending_events_.begin(); it != pending_events_.end();) {
    if (!driver_->event_done(it->first)) {
      ++it;
      continue;
    }
    driver_->destroy_event(it->first);
    Block* block = it->second;
    it = pending_events_.erase(it);
    if (--block->pending_events == 0 && !block->allocated) free_block(block);
  }
}

// Returns every segment that is one free block to the driver.
void CachingAllocator::release_cached_segments() {
  for (FreeSet* pool : {&shared_free_.small, &shared_free_.large}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* block = *it;
      if (block->prev != nullptr || block->next != nullptr) {
        ++it;
        continue;
      }
      driver_->free(block->ptr);
      it = pool->erase(it);
      segments_.erase(block->ptr);
      stats_.reserved_bytes -= block->size;
      ++stats_.device_frees;
      delete block;
    }
  }
}

void CachingAllocator::fail_out_of_memory(size_t requested, size_t segment) {
  std::ostringstream text;
  text << tag::kCuda.prefix() + "cuda:" << device_ << " out of memory: cannot allocate "
       << format_bytes(requested) << " (" << requested << " bytes requested, needing a new "
       << format_bytes(segment) << " segment). The caching allocator has "
       << format_bytes(stats_.allocated_bytes) << " (" << stats_.allocated_bytes
       << " bytes) allocated and " << format_bytes(stats_.reserved_bytes) << " ("
       << stats_.reserved_bytes
       << " bytes) reserved after returning its unused cached segments to the driver; the "
          "rest of the device is held by other processes or libraries. Use a smaller batch or "
          "micro-batch size (or activation checkpointing), or release tensors that are no "
          "longer needed.";
  throw Error(text.str());
}

void CachingAllocator::record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  if (it == active_.end()) {
    tag::kCuda.fail(
        "record_stream: ", ptr, " is not a live allocation of the cuda:", device_,
        " caching allocator (expected a pointer returned by allocate() and not yet freed)");
  }
  Block* block = it->second;
  if (stream != block->stream) block->stream_uses.insert(stream);
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_.count(ptr) != 0;
}

std::optional<CachingAllocator::Allocation> CachingAllocator::allocation_containing(
    const void* ptr) const {
  const auto* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [base, head] : segments_) {
    for (const Block* block = head; block != nullptr; block = block->next) {
      if (p < block->ptr || p >= block->ptr + block->size) continue;
      if (!block->allocated || p >= block->ptr + block->requested) return std::nullopt;
      return Allocation{block->ptr, block->requested};
    }
  }
  return std::nullopt;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_pool_ != 0) {
    tag::kCuda.fail("empty_cache on cuda:", device_,
                    " during a CUDA graph capture: CUDA does not permit returning memory to the "
                    "driver then; call it before or after the capture");
  }
  process_events();
  release_cached_segments();
}

PoolId CachingAllocator::begin_capture(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capture_pool_ != 0) {
    tag::kCuda.fail("cuda:", device_,
                    " caching allocator: a graph capture is already under way; captures on one "
                    "device must not overlap");
  }
  capture_pool_ = ++last_pool_;
  capture_stream_ = stream;
  private_free_[capture_pool_];
  return capture_pool_;
}

void CachingAllocator::end_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capture_pool_ = 0;
  capture_stream_ = nullptr;
}

void CachingAllocator::release_pool(PoolId pool) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = private_free_.find(pool);
  if (pool == 0 || it == private_free_.end()) {
    tag::kCuda.fail("release_pool: cuda:", device_, " has no private pool ", pool);
  }
  if (pool == capture_pool_) {
    tag::kCuda.fail("release_pool: pool ", pool, " of cuda:", device_,
                    " is still being captured into; end the capture first");
  }
  for (auto& [base, head] : segments_) {
    if (head->pool != pool) continue;
    for (Block* block = head; block != nullptr; block = block->next) block->pool = 0;
  }
  shared_free_.small.merge(it->second.small);  // the order does not involve the pool
  shared_free_.large.merge(it->second.large);
  private_free_.erase(it);
}

CachingStats CachingAllocator::caching_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
  reset_peak();
}

// ---- The CUDA runtime driver ----

namespace {

class CudaMemoryDriver final : public DeviceMemoryDriver {
 public:
  explicit CudaMemoryDriver(int device) : device_(device) {}

  ~CudaMemoryDriver() override {
    for (cudaEvent_t event : idle_events_)
      LOOM_CUDA_WARN(cudaEventDestroy(event));
  }

  void* malloc(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    // A segment for a private pool is allocated mid-capture (Note [Private pools for graph
    // capture]), which the capture's own mode would refuse.
    cudaError_t status;
    {
      kernels::cuda::RelaxedCaptureMode relaxed;
      status = cudaMalloc(&ptr, nbytes);
    }
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // handled here: the caller frees its cache and retries
      return nullptr;
    }
    LOOM_CUDA_CHECK(status);
    return ptr;
  }

  void free(void* ptr) override {
    DeviceGuard guard(device_);
    LOOM_CUDA_CHECK(cudaFree(ptr));
  }

  EventHandle record_event(cudaStream_t stream) override {
    // Events must be created on the device of the stream they are recorded on; this
    // device's events are pooled, the rare ones for other devices are not.
    int stream_device = -1;
    LOOM_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
    DeviceGuard guard(stream_device);
    cudaEvent_t event = nullptr;
    if (stream_device == device_ && !idle_events_.empty()) {
      event = idle_events_.back();
      idle_events_.pop_back();
    } else {
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      if (stream_device != device_) foreign_events_.insert(event);
    }
    cudaError_t status = cudaEventRecord(event, stream);
    if (status != cudaSuccess) {
      destroy_event(event);
      LOOM_CUDA_CHECK(status);
    }
    return event;
  }

  bool event_done(EventHandle handle) override {
    cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle));
    if (status == cudaSuccess) return true;
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    LOOM_CUDA_CHECK(status);
    return false;
  }

  void destroy_event(EventHandle handle) override {
    auto event = static_cast<cudaEvent_t>(handle);
    if (foreign_events_.erase(event) != 0) {
      LOOM_CUDA_WARN(cudaEventDestroy(event));
    } else {
      idle_events_.push_back(event);
    }
  }

  cudaStream_t current_stream() override { return cuda::current_stream(device_); }

 private:
  int device_;
  std::vector<cudaEvent_t> idle_events_;  // created on device_, ready for reuse
  std::unordered_set<cudaEvent_t> foreign_events_;
};

// One slot per device, filled on first use and leaked (the driver may be gone at exit).
struct AllocatorTable {
  explicit AllocatorTable(int devices) : slots(static_cast<size_t>(devices)) {}
  std::mutex mutex;
  std::vector<std::atomic<CachingAllocator*>> slots;
};

AllocatorTable& allocator_table() {
  static AllocatorTable* table = new AllocatorTable(device_count());
  return *table;
}

}  // namespace

std::unique_ptr<DeviceMemoryDriver> make_cuda_memory_driver(int device) {
  return std::make_unique<CudaMemoryDriver>(device);
}

CachingAllocator& caching_allocator(int device) {
  check_device_index(device);
  AllocatorTable& table = allocator_table();
  std::atomic<CachingAllocator*>& slot = table.slots[static_cast<size_t>(device)];
  if (CachingAllocator* allocator = slot.load(std::memory_order_acquire)) return *allocator;
  std::lock_guard<std::mutex> lock(table.mutex);
  if (CachingAllocator* allocator = slot.load(std::memory_order_relaxed)) return *allocator;
  auto* allocator = new CachingAllocator(device, make_cuda_memory_driver(device));
  slot.store(allocator, std::memory_order_release);
  return *allocator;
}

void record_stream(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;
  for (std::atomic<CachingAllocator*>& slot : allocator_table().slots) {
    CachingAllocator* allocator = slot.load(std::memory_order_acquire);
    if (allocator != nullptr && allocator->owns(ptr)) {
      allocator->record_stream(ptr, stream);
      return;
    }
  }
  tag::kCuda.fail("record_stream: ", ptr,
                  " was not handed out by a CUDA caching allocator (or was already freed)");
}

void empty_cache() {
  for (std::atomic<CachingAllocator*>& slot : allocator_table().slots) {
    if (CachingAllocator* allocator = slot.load(std::memory_order_acquire)) {
      allocator->empty_cache();
    }
  }
}

CachingStats caching_stats(int device) {
  return caching_allocator(device).caching_stats();
}

void reset_peak_stats(int device) {
  caching_allocator(device).reset_peak_stats();
}

}  // namespace loom::cuda

namespace loom {

Allocator& builtin_cuda_allocator(int index) {
  return cuda::caching_allocator(index);
}

}  // namespace loom
