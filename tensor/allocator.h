#pragma once
// One allocator per device, with byte accounting for memory reports.
// The CPU allocator is always present; in a build with CUDA (LOOM_WITH_CUDA), cuda:N uses
// the caching allocator of device N (tensor/cuda/caching_allocator.h). Users may replace
// either with register_allocator().

#include <atomic>
#include <cstddef>
#include <functional>

#include "tensor/device.h"

namespace loom {

struct MemoryStats {
  size_t current_bytes = 0;  // bytes handed out and not yet returned
  size_t peak_bytes = 0;     // high-water mark of current_bytes since the last reset
  size_t allocations = 0;    // number of allocate() calls since start
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `nbytes` bytes (64-byte aligned on the CPU); never null for nbytes > 0.
  // Thread-safe.
  virtual void* allocate(size_t nbytes) = 0;
  // Returns memory obtained from allocate() with the same nbytes. Thread-safe, never throws.
  virtual void deallocate(void* ptr, size_t nbytes) noexcept = 0;

  MemoryStats stats() const;
  void reset_peak();

 protected:
  void record_allocation(size_t nbytes);
  void record_deallocation(size_t nbytes) noexcept;

 private:
  std::atomic<size_t> current_{0};
  std::atomic<size_t> peak_{0};
  std::atomic<size_t> allocations_{0};
};

// The allocator for `device`; throws loom::Error when there is none (cuda:N in a build
// without CUDA, or N beyond the devices present).
Allocator& allocator_for(Device device);
// Installs `allocator` (not owned, must outlive its use) for every device of `type`;
// nullptr restores the built-in one.
void register_allocator(DeviceType type, Allocator* allocator);

}  // namespace loom
