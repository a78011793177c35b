#include "strategies/memory_report.h"

#include <cstdio>

#include "strategies/strategy.h"

namespace loom::strategies {

MemoryReport local_memory_report(Device compute) {
  const MemoryStats device = allocator_for(compute).stats();
  MemoryReport report;
  report.peak_bytes = static_cast<int64_t>(device.device_peak_bytes);
  for (size_t k = 0; k < kMemoryKindCount; ++k)
    report.peak_by_kind[k] = static_cast<int64_t>(device.peak_by_kind[k]);
  if (!compute.is_cpu()) {
    const size_t offloaded = static_cast<size_t>(MemoryKind::Offloaded);
    report.peak_by_kind[offloaded] =
        static_cast<int64_t>(allocator_for(Device::cpu()).stats().peak_by_kind[offloaded]);
  }
  return report;
}

void reset_memory_peaks(Device compute) {
  allocator_for(compute).reset_peak();
  if (!compute.is_cpu()) allocator_for(Device::cpu()).reset_peak();
}

MemoryReport max_over_ranks(Strategy& strategy, const MemoryReport& local) {
  if (strategy.world_size() <= 1) return local;
  // f64 holds byte counts exactly up to 2^53.
  std::vector<double> values = {static_cast<double>(local.peak_bytes)};
  for (int64_t bytes : local.peak_by_kind) values.push_back(static_cast<double>(bytes));
  Tensor all = strategy.all_reduce(
      Tensor::from_vector<double>(values, {static_cast<int64_t>(values.size())})
          .to(strategy.root_device()),
      comm::ReduceOp::Max);
  std::vector<double> maxima = all.to(Device::cpu()).to_vector<double>();
  MemoryReport report;
  report.peak_bytes = static_cast<int64_t>(maxima[0]);
  for (size_t k = 0; k < kMemoryKindCount; ++k)
    report.peak_by_kind[k] = static_cast<int64_t>(maxima[k + 1]);
  return report;
}

std::string peak_by_kind_text(const MemoryReport& report) {
  std::string text;
  for (size_t k = 0; k < kMemoryKindCount; ++k) {
    char item[96];
    std::snprintf(item, sizeof item, "%s%s %.2f MiB", k == 0 ? "" : ", ",
                  memory_kind_name(static_cast<MemoryKind>(k)),
                  static_cast<double>(report.peak_by_kind[k]) / (1 << 20));
    text += item;
  }
  return text;
}

}  // namespace loom::strategies
