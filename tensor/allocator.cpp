#include "tensor/allocator.h"

#include <cstdlib>
#include <new>

#include "tensor/error.h"

#if LOOM_WITH_CUDA
#include "tensor/cuda/caching_allocator.h"
#endif

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

CpuAllocator& default_cpu_allocator() {
  static CpuAllocator cpu;
  return cpu;
}

// User overrides per device type; the CPU entry starts as the built-in allocator.
Allocator*& registered(DeviceType type) {
  static Allocator* table[] = {&default_cpu_allocator(), nullptr};
  return table[static_cast<int>(type)];
}

}  // namespace

Allocator& allocator_for(Device device) {
  if (Allocator* allocator = registered(device.type)) return *allocator;
#if LOOM_WITH_CUDA
  if (device.is_cuda()) return cuda::caching_allocator(device.index);
#endif
  fail("[tensor] no allocator for ", device,
       ": this build has no CUDA support (configure with -DLOOM_WITH_CUDA=ON on a machine "
       "with the CUDA toolkit)");
}

void register_allocator(DeviceType type, Allocator* allocator) {
  bool restore_cpu = allocator == nullptr && type == DeviceType::CPU;
  registered(type) = restore_cpu ? &default_cpu_allocator() : allocator;
}

}  // namespace loom
