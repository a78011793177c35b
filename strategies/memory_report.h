#pragma once
// Peak tensor memory by kind (MemoryKind in tensor/allocator.h), for train_gpt's summary and
// metrics lines and loom-perf strategy: what a user compares with the ZeRO formulas
// (docs/sharding.md, "Memory").

#include <array>
#include <cstdint>
#include <string>

#include "tensor/allocator.h"
#include "tensor/device.h"

namespace loom::strategies {

class Strategy;

struct MemoryReport {
  // Peak bytes on the compute device (every kind but offloaded) since the last
  // reset_memory_peaks.
  int64_t peak_bytes = 0;
  // Each kind's own high-water mark; offloaded counts the host pool a strategy offloads to.
  std::array<int64_t, kMemoryKindCount> peak_by_kind = {};

  int64_t peak(MemoryKind kind) const { return peak_by_kind[static_cast<size_t>(kind)]; }
};

// This process's report for a rank computing on `compute`. On a GPU the offloaded kind comes
// from the host allocator; on the CPU both share one allocator and the kinds tell them apart.
MemoryReport local_memory_report(Device compute);

// Starts the peaks afresh from what is allocated now (torch.cuda.reset_peak_memory_stats):
// train_gpt calls it once setup is done, so that setup's one-time copies (flattening the
// parameters into units) do not hide the training step's peaks.
void reset_memory_peaks(Device compute);

// The element-wise maximum over the strategy's ranks (each figure may come from a different
// rank). Collective: every rank calls it at the same point.
MemoryReport max_over_ranks(Strategy& strategy, const MemoryReport& local);

// "parameters 1.2 MiB, gradients 0.6 MiB, ..." for summaries.
std::string peak_by_kind_text(const MemoryReport& report);

}  // namespace loom::strategies
