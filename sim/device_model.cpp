#include "sim/device_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>

#include "core/tags.h"

namespace loom::sim {

DeviceModel::DeviceModel(const Cluster& cluster, int ranks_per_node, DType compute_dtype)
    : cluster_(cluster),
      rates_(ranks_per_node > 1 && cluster.device.shared
                 ? *cluster.device.shared
                 : static_cast<const DeviceRates&>(cluster.device)),
      ranks_per_node_(ranks_per_node),
      slowdown_(std::max(1.0, static_cast<double>(ranks_per_node) / cluster.compute_slots)),
      compute_dtype_(compute_dtype) {
  // (Only a CPU cluster has a comm_core_s: parse_cluster refuses one beside host.memory_gbps.)
  if (!cluster.comm_core_s.empty() && ranks_per_node >= cluster.compute_slots) {
    const double per_slot = static_cast<double>(ranks_per_node) / cluster.compute_slots;
    comm_core_s_ = cluster.comm_core_s.at(per_slot);
    comm_blocking_s_ = cluster.comm_blocking_s.empty() ? *comm_core_s_
                                                       : cluster.comm_blocking_s.at(per_slot);
    stragglers_ = !cluster.compute_spread_s.empty() && per_slot <= 1;
  }
}

double DeviceModel::straggler_seconds(double computed_s, int ranks) const {
  if (!stragglers_ || ranks < 2 || computed_s <= 0) return 0;
  // Beyond either end of the curve the spread grows as sqrt(T) from that end: a random walk,
  // as the calibrations measured it within the curve (docs/simulation.md).
  const RateCurve& spread = cluster_.compute_spread_s;
  const double interval_us = computed_s * 1e6;
  const double end_us = std::clamp(interval_us, spread.first_size(), spread.last_size());
  const double sigma = spread.at(end_us) * std::sqrt(interval_us / end_us);
  return expected_maximum_of_normals(ranks) * sigma;
}

double expected_maximum_of_normals(int n) {
  if (n <= 1) return 0;
  thread_local std::map<int, double> known;  // (a few group sizes per simulation)
  if (const auto found = known.find(n); found != known.end()) return found->second;
  // The integral of x n phi(x) Phi(x)^(n-1) over the line, by the midpoint rule: the density
  // is below 1e-30 outside [-12, 12] for any n up to 2^31.
  constexpr double kStep = 1e-3, kFrom = -12, kTo = 12;
  const double root_2pi = std::sqrt(2 * std::numbers::pi);
  double sum = 0;
  for (double x = kFrom + kStep / 2; x < kTo; x += kStep) {
    const double phi = std::exp(-x * x / 2) / root_2pi;
    const double cdf = 0.5 * std::erfc(-x / std::numbers::sqrt2);
    sum += x * n * phi * std::pow(cdf, n - 1);
  }
  return known[n] = sum * kStep;
}

double DeviceModel::communication_core_seconds(double transfer_s, bool blocking) const {
  if (!comm_core_s_) return 0;
  return slowdown_ * ((blocking ? *comm_blocking_s_ : *comm_core_s_) + transfer_s);
}

double DeviceModel::flops_rate(const std::map<DType, RateCurve>& curves, const OpCost& cost,
                               const char* field) const {
  const auto& named = rates_.op_flops_per_s;
  if (cost.op_class == OpClass::Attention) {  // a curve for its head dimension first
    const auto own = named.find(std::string(cost.op) + "@d" + std::to_string(cost.dims[3]));
    if (own != named.end()) return own->second.at(cost.flops);
  }
  const auto own = named.find(std::string_view(cost.op));
  if (own != named.end()) return own->second.at(cost.flops);
  const DType dtype = cost.dtype == DType::F32 ? compute_dtype_ : cost.dtype;
  const auto it = curves.find(dtype);
  if (it == curves.end()) {
    tag::kLoomSim.fail("cluster ", cluster_.name, " has no device.", field, ".",
                       dtype_name(dtype), " curve for op ", cost.op, " in ", dtype_name(dtype),
                       "; add one or simulate another precision");
  }
  return it->second.at(cost.flops);
}

double DeviceModel::host_seconds(const OpCost& cost) const {
  const double bytes = cost.bytes_read + cost.bytes_written;
  const auto own = cluster_.host_op_bytes_per_s.find(std::string_view(cost.op));
  const RateCurve& curve =
      own != cluster_.host_op_bytes_per_s.end() ? own->second : cluster_.host_memory_bytes_per_s;
  return bytes / (curve.at(bytes) / ranks_per_node_);
}

double DeviceModel::seconds(const OpCost& cost) const {
  if (cost.on_host && cost.op_class != OpClass::Transfer && !cluster_.host_memory_bytes_per_s.empty())
    return host_seconds(cost);
  double busy = 0;
  switch (cost.op_class) {
    case OpClass::Gemm:
      busy = cost.flops / flops_rate(rates_.gemm_flops, cost, "gemm_tflops");
      break;
    case OpClass::Attention:
      busy = cost.flops / flops_rate(rates_.attention_flops, cost, "attention_tflops");
      break;
    case OpClass::Transfer:
      busy = (cost.bytes_read + cost.bytes_written) / 2 / cluster_.pcie_bytes_per_s;
      break;
    default: {
      const double bytes = cost.bytes_read + cost.bytes_written;
      const auto own = rates_.op_bytes_per_s.find(std::string_view(cost.op));
      const RateCurve& curve =
          own != rates_.op_bytes_per_s.end() ? own->second : rates_.memory_bytes_per_s;
      busy = bytes / curve.at(bytes);
    }
  }
  return (rates_.op_overhead_s + busy) * slowdown_;
}

double DeviceModel::peak_flops(DType dtype) const {
  const auto it = cluster_.device.peak_flops.find(dtype);
  if (it == cluster_.device.peak_flops.end()) {
    tag::kLoomSim.fail("cluster ", cluster_.name, " gives no device.peak_tflops.",
                       dtype_name(dtype));
  }
  return it->second;
}

}  // namespace loom::sim
