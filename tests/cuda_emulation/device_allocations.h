#pragma once
// The emulated device's live allocations, as its caching allocator handed them out: the lookup
// the WorkLog counts a launch's argument bytes with, and the stream-order check follows.

#include <optional>

#include "runtime/work_log.h"
#include "tensor/cuda/caching_allocator.h"

namespace loom::cuda_emulation {

inline std::optional<Allocation> device_allocation(const void* address) {
  const auto allocation = cuda::caching_allocator(0).allocation_containing(address);
  if (!allocation) return std::nullopt;
  return Allocation{allocation->base, allocation->bytes};
}

}  // namespace loom::cuda_emulation
