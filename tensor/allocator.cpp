#include "tensor/allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tags.h"


namespace loom {

namespace {

// Adds nbytes to `current` and raises `peak` to the new value if it is higher.
void add_and_raise_peak(std::atomic<size_t>& current, std::atomic<size_t>& peak, size_t nbytes) {
  size_t now = current.fetch_add(nbytes) + nbytes;
  size_t seen = peak.load();
  while (now > seen && !peak.compare_exchange_weak(seen, now)) {
  }
}

}  // namespace

const char* memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Activations: return "activations";
    case MemoryKind::Parameters: return "parameters";
    case MemoryKind::Gradients: return "gradients";
    case MemoryKind::OptimizerState: return "optimizer_state";
    case MemoryKind::Communication: return "communication";
    case MemoryKind::Offloaded: return "offloaded";
  }
  return "unknown";
}

MemoryStats Allocator::stats() const {
  MemoryStats stats{.current_bytes = current_.load(),
                    .peak_bytes = peak_.load(),
                    .allocations = allocations_.load(),
                    .device_current_bytes = device_current_.load(),
                    .device_peak_bytes = device_peak_.load()};
  for (size_t k = 0; k < kMemoryKindCount; ++k) {
    stats.current_by_kind[k] = kind_current_[k].load();
    stats.peak_by_kind[k] = kind_peak_[k].load();
  }
  return stats;
}

void Allocator::reset_peak() {
  peak_.store(current_.load());
  device_peak_.store(device_current_.load());
  for (size_t k = 0; k < kMemoryKindCount; ++k) kind_peak_[k].store(kind_current_[k].load());
}

void Allocator::record_allocation(size_t nbytes) {
  add_and_raise_peak(current_, peak_, nbytes);
  allocations_.fetch_add(1);
}

void Allocator::count_kind(MemoryKind kind, size_t nbytes) noexcept {
  const auto k = static_cast<size_t>(kind);
  add_and_raise_peak(kind_current_[k], kind_peak_[k], nbytes);
  if (kind != MemoryKind::Offloaded) add_and_raise_peak(device_current_, device_peak_, nbytes);
}

void Allocator::uncount_kind(MemoryKind kind, size_t nbytes) noexcept {
  kind_current_[static_cast<size_t>(kind)].fetch_sub(nbytes);
  if (kind != MemoryKind::Offloaded) device_current_.fetch_sub(nbytes);
}

void Allocator::record_deallocation(size_t nbytes) noexcept {
  current_.fetch_sub(nbytes);
}

namespace {

constexpr size_t kCpuAlignment = 64;  // one cache line; also what AVX-512 loads prefer
constexpr size_t kPageAlignment = 4096;

// Note [Caching CPU blocks]
// A training step allocates and frees the same large blocks (activations, their gradients)
// every step. From glibc they come as fresh pages each time (blocks above its mmap threshold,
// or heap it trimmed), and the page faults and the kernel's zeroing of those pages cost
// about a tenth of a small model's step. So blocks of kCacheFrom bytes and more are kept
// when freed, by exact size, and handed out again; at most kCacheAtMost bytes are kept (a
// block beyond that goes back to glibc). Accounting (stats()) counts blocks handed out only,
// as before. Smaller blocks go to glibc directly, whose own free lists serve them well. A
// program that owns its process may instead keep everything in glibc's heap
// (use_process_heap_for_cpu_blocks, tensor/allocator.h), which also avoids the fresh pages
// but reuses a freed block for a request of another size.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kCacheFrom = size_t{64} << 10;
  static constexpr size_t kCacheAtMost = size_t{1} << 30;

  ~CpuAllocator() override {
    for (auto& [size, blocks] : free_)
      for (void* block : blocks)
        std::free(block);
  }

  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const auto [alignment, rounded] = block_of(nbytes);
    void* ptr = rounded >= kCacheFrom ? take_cached(rounded, alignment) : nullptr;
    if (ptr == nullptr) ptr = std::aligned_alloc(alignment, rounded);
    if (ptr == nullptr)
      tag::kTensor.fail("cpu allocator: out of memory allocating ", nbytes, " bytes");
    record_allocation(nbytes);
    return ptr;
  }
  void deallocate(void* ptr, size_t nbytes) noexcept override {
    if (ptr == nullptr) return;
    record_deallocation(nbytes);
    const auto [alignment, rounded] = block_of(nbytes);
    if (rounded >= kCacheFrom && keep(ptr, rounded, alignment)) return;
    std::free(ptr);
  }
  // Stops caching and gives the cached blocks back.
  void stop_caching() {
    std::lock_guard<std::mutex> lock(mutex_);
    cache_at_most_ = 0;
    for (auto& [size, blocks] : free_)
      for (void* block : blocks)
        std::free(block);
    free_.clear();
    cached_bytes_ = 0;
  }

 private:
  // The alignment and size of the block that holds `nbytes`: whole pages get page alignment,
  // so that O_DIRECT file I/O can use them as they are (strategies/sharded/swap_file.h).
  static std::pair<size_t, size_t> block_of(size_t nbytes) {
    const size_t alignment = nbytes % kPageAlignment == 0 ? kPageAlignment : kCpuAlignment;
    return {alignment, (nbytes + alignment - 1) / alignment * alignment};
  }
  // A block's key: its size, and whether it is page-aligned (a 64-byte-aligned block of a
  // whole number of pages must not serve a page-aligned request).
  static size_t key(size_t rounded, size_t alignment) {
    return rounded | (alignment == kPageAlignment ? 1 : 0);
  }
  void* take_cached(size_t rounded, size_t alignment) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = free_.find(key(rounded, alignment));
    if (found == free_.end() || found->second.empty()) return nullptr;
    void* ptr = found->second.back();
    found->second.pop_back();
    cached_bytes_ -= rounded;
    return ptr;
  }
  bool keep(void* ptr, size_t rounded, size_t alignment) noexcept {
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cached_bytes_ + rounded > cache_at_most_) return false;
      free_[key(rounded, alignment)].push_back(ptr);
      cached_bytes_ += rounded;
      return true;
    } catch (...) {  // no memory for the list: give the block back instead
      return false;
    }
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
  size_t cache_at_most_ = kCacheAtMost;
};

CpuAllocator& default_cpu_allocator() {
  static CpuAllocator cpu;
  return cpu;
}

// The meta device's: counts bytes, holds none (tensor/meta.h).
class MetaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes > 0) record_allocation(nbytes);
    return nullptr;
  }
  void deallocate(void*, size_t nbytes) noexcept override {
    if (nbytes > 0) record_deallocation(nbytes);
  }
};

MetaAllocator& default_meta_allocator() {
  static MetaAllocator meta;
  return meta;
}

// MetaAllocatorScope's, on this thread (null: none).
thread_local Allocator* thread_meta_allocator = nullptr;

// User overrides per device type; the CPU and meta entries start as the built-in allocators.
Allocator*& registered(DeviceType type) {
  static Allocator* table[] = {&default_cpu_allocator(), nullptr, &default_meta_allocator()};
  return table[static_cast<int>(type)];
}

}  // namespace

void use_process_heap_for_cpu_blocks() {
  default_cpu_allocator().stop_caching();
  // glibc only (sanitizers' allocators ignore mallopt): large blocks from the heap, kept.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);  // -1: never trim
}

MetaAllocatorScope::MetaAllocatorScope()
    : allocator_(std::make_unique<MetaAllocator>()),
      previous_(std::exchange(thread_meta_allocator, allocator_.get())) {}

MetaAllocatorScope::~MetaAllocatorScope() { thread_meta_allocator = previous_; }

Allocator& allocator_for(Device device) {
  if (device.is_meta() && thread_meta_allocator != nullptr) return *thread_meta_allocator;
  if (Allocator* allocator = registered(device.type)) return *allocator;
  if (device.is_cuda()) return builtin_cuda_allocator(device.index);
  tag::kTensor.fail("no allocator for ", device);  // the CPU's is always registered
}

void register_allocator(DeviceType type, Allocator* allocator) {
  if (allocator == nullptr && type == DeviceType::CPU) allocator = &default_cpu_allocator();
  if (allocator == nullptr && type == DeviceType::Meta) allocator = &default_meta_allocator();
  registered(type) = allocator;
}

}  // namespace loom
