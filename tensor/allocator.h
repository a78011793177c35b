#pragma once
// One allocator per device, with byte accounting for memory reports.
// The CPU and meta allocators are always present; in a build with CUDA (LOOM_WITH_CUDA), cuda:N
// uses the caching allocator of device N (tensor/cuda/caching_allocator.h). Users may replace
// either with register_allocator().

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "tensor/device.h"

namespace loom {

// What a block of tensor memory holds, for the memory reports of train_gpt, loom-perf and
// the sharded strategies (docs/sharding.md, "Memory"). A Storage starts as Activations
// (activations and every other temporary of a step) and is retagged by whoever gives it a
// lasting role: Module::register_parameter, autograd's gradient accumulation, optimizers,
// the DDP reducer and the sharding engine. Offloaded is memory a strategy moved off the
// compute device on purpose (offload_optimizer, offload_param): on a CPU-only machine it
// shares the allocator with the rest but is still counted apart, so that the device-side
// saving shows.
enum class MemoryKind : uint8_t {
  Activations,
  Parameters,
  Gradients,
  OptimizerState,
  Communication,
  Offloaded,
};
inline constexpr size_t kMemoryKindCount = 6;
// "activations", "parameters", "gradients", "optimizer_state", "communication", "offloaded".
const char* memory_kind_name(MemoryKind kind);

struct MemoryStats {
  size_t current_bytes = 0;  // bytes handed out and not yet returned
  size_t peak_bytes = 0;     // high-water mark of current_bytes since the last reset
  size_t allocations = 0;    // number of allocate() calls since start
  // The same per MemoryKind (each kind's own high-water mark), and for every kind but
  // Offloaded together: the bytes on the compute device.
  std::array<size_t, kMemoryKindCount> current_by_kind = {};
  std::array<size_t, kMemoryKindCount> peak_by_kind = {};
  size_t device_current_bytes = 0;
  size_t device_peak_bytes = 0;
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns memory for `nbytes` bytes (on the CPU 64-byte aligned, 4096-byte aligned when
  // nbytes is a multiple of 4096); never null for nbytes > 0, except on the meta device,
  // whose allocator counts the bytes and holds none.
  // Thread-safe.
  virtual void* allocate(size_t nbytes) = 0;
  // Returns memory obtained from allocate() with the same nbytes. Thread-safe, never throws.
  virtual void deallocate(void* ptr, size_t nbytes) noexcept = 0;

  MemoryStats stats() const;
  void reset_peak();

  // Kind accounting, called by Storage as it allocates, releases and retags its memory.
  void count_kind(MemoryKind kind, size_t nbytes) noexcept;
  void uncount_kind(MemoryKind kind, size_t nbytes) noexcept;

 protected:
  void record_allocation(size_t nbytes);
  void record_deallocation(size_t nbytes) noexcept;

 private:
  std::atomic<size_t> current_{0};
  std::atomic<size_t> peak_{0};
  std::atomic<size_t> allocations_{0};
  std::array<std::atomic<size_t>, kMemoryKindCount> kind_current_{};
  std::array<std::atomic<size_t>, kMemoryKindCount> kind_peak_{};
  std::atomic<size_t> device_current_{0};
  std::atomic<size_t> device_peak_{0};
};

// Gives the calling thread a meta allocator of its own until destroyed: allocator_for(meta)
// returns it on this thread, so that each simulated rank of a process (a pipeline's stages, one
// per thread: docs/simulation.md) counts its own memory. A Storage keeps the allocator it came
// from, so memory freed on another thread is returned where it was counted; the scope must
// outlive the tensors made under it.
class MetaAllocatorScope {
 public:
  MetaAllocatorScope();
  ~MetaAllocatorScope();
  MetaAllocatorScope(const MetaAllocatorScope&) = delete;
  MetaAllocatorScope& operator=(const MetaAllocatorScope&) = delete;

 private:
  std::unique_ptr<Allocator> allocator_;
  Allocator* previous_;
};

// The allocator for `device`: the one registered for its type, else the built-in one; throws
// loom::Error when there is none (cuda:N in a build without CUDA, or N beyond the devices
// present).
Allocator& allocator_for(Device device);
// The built-in allocator of cuda:`index`. A build with CUDA defines it in
// tensor/cuda/caching_allocator.cpp (that device's caching allocator); a build without CUDA
// defines it in tensor/no_cuda_allocator.cpp, where it throws loom::Error naming
// LOOM_WITH_CUDA. allocator_for calls it, so allocator.cpp includes no CUDA header.
Allocator& builtin_cuda_allocator(int index);
// Page-locks (cudaHostRegister) and unlocks the host memory [ptr, ptr + nbytes), whole pages,
// for Storage::pin. Defined beside builtin_cuda_allocator: in a build without CUDA,
// page_lock_host_memory throws loom::Error naming LOOM_WITH_CUDA and the unlock does nothing.
void page_lock_host_memory(void* ptr, size_t nbytes);
void page_unlock_host_memory(void* ptr) noexcept;
// Installs `allocator` (not owned, must outlive its use) for every device of `type`;
// nullptr restores the built-in one.
void register_allocator(DeviceType type, Allocator* allocator);

// By default the built-in CPU allocator keeps freed blocks of 64 KiB and more, up to 1 GiB,
// for requests of exactly their size (Note [Caching CPU blocks] in allocator.cpp); the rest
// goes back to glibc, whose large blocks are fresh pages each time. This turns that cache off
// for good and sets glibc's malloc, for the whole process, to serve every block from its heap
// (no mmap) and never give the heap back (mallopt M_MMAP_MAX 0, M_TRIM_THRESHOLD off), so that
// freed memory serves requests of any size, coalesced: the process holds about its peak of
// live bytes, where the exact-size cache also holds the idle blocks of sizes not in use at the
// peak (a 16-bit autocast step frees blocks of more sizes), at the same step time. For a
// program that owns its process (train_gpt calls it at start-up), before the first tensor.
void use_process_heap_for_cpu_blocks();

}  // namespace loom
