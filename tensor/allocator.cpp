#include "tensor/allocator.h"

#include <cstdlib>
#include <new>

#include "tensor/error.h"

namespace loom {

MemoryStats Allocator::stats() const {
  return {current_.load(), peak_.load(), allocations_.load()};
}

void Allocator::reset_peak() {
  peak_.store(current_.load());
}

void Allocator::record_allocation(size_t nbytes) {
  size_t now = current_.fetch_add(nbytes) + nbytes;
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  allocations_.fetch_add(1);
}

void Allocator::record_deallocation(size_t nbytes) noexcept {
  current_.fetch_sub(nbytes);
}

namespace {

constexpr size_t kCpuAlignment = 64;  // one cache line; also what AVX-512 loads prefer

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    if (ptr == nullptr) fail("[tensor] cpu allocator: out of memory allocating ", nbytes, " bytes");
    record_allocation(nbytes);
    return ptr;
  }
  void deallocate(void* ptr, size_t nbytes) noexcept override {
    if (ptr == nullptr) return;
    std::free(ptr);
    record_deallocation(nbytes);
  }
};

Allocator*& registered(DeviceType type) {
  static CpuAllocator cpu;
  static Allocator* table[] = {&cpu, nullptr};
  return table[static_cast<int>(type)];
}

}  // namespace

Allocator& allocator_for(Device device) {
  Allocator* allocator = registered(device.type);
  if (allocator == nullptr) {
    fail("[tensor] no allocator for ", device,
         ": this build has no CUDA support (configure with -DLOOM_WITH_CUDA=ON)");
  }
  return *allocator;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  registered(type) = allocator;
}

}  // namespace loom
