#pragma once
// The device model: how long one op of the meta device (tensor/meta.h) takes on a cluster's
// device. GEMMs and attention run at the achieved FLOP/s of their own curve (device.ops_tflops,
// by op name) or else of their dtype's curve at their size;
// every other op moves its bytes at its own curve's rate (device.ops_gbps, by op name) or else
// at the achieved memory bandwidth for that many bytes; copies
// between devices (offload) cross PCIe. Each op also pays the device's per-op overhead.
// Ranks of one node beyond its compute slots share them (a CPU's cores), so their ops take
// longer by ranks / slots; with more than one rank on a node, the device's shared rates
// (device.shared: measured with every slot busy) apply where the cluster gives them.

#include <optional>

#include "sim/cluster.h"
#include "tensor/meta.h"

namespace loom::sim {

class DeviceModel {
 public:
  // Refers to `cluster`, which must outlive it.
  // `ranks_per_node`: how many ranks of the job share one node's compute slots.
  // `compute_dtype`: the precision's (sim::compute_dtype). Under autocast GEMMs compute in
  // bf16 on both paths and take the bf16 curve by their own dtype; the CPU path's attention
  // and f16 products compute in f32 on rounded operands. An f32 GEMM or attention runs at the
  // compute dtype's curves (a CPU cluster's f16 and attention curves are its f32 ones:
  // sim/clusters/this-machine.json).
  DeviceModel(const Cluster& cluster, int ranks_per_node, DType compute_dtype = DType::F32);
  // (An op on the host (OpCost::on_host) moves its bytes at the host's curves, the node's
  // ranks sharing them, where the cluster describes a host; else it is timed as a device op.)
  // Seconds. Throws loom::Error for a GEMM or attention dtype the cluster has no curve for.
  double seconds(const OpCost& cost) const;
  // The dense peak for `dtype` (FLOP/s), for MFU; throws when the cluster gives none.
  double peak_flops(DType dtype) const;
  // The compute time a communication operation of `transfer_s` seconds takes from its rank:
  // on a CPU cluster whose node's ranks fill its compute slots, the cluster's comm_core_s at
  // the node's ranks per slot plus the transfer (its copies run on the cores), slowed as the
  // rank's ops are; else 0. `blocking`: the rank computed nothing between the operation's
  // issue and its wait, so it takes the cluster's comm_blocking_s where it gives one.
  double communication_core_seconds(double transfer_s, bool blocking) const;
  // Note [Stragglers at a meeting]
  // Ranks that compute the same work do not take the same time: each rank's computation over
  // an interval varies (the cluster's compute_spread_s: scheduling, interrupts, the caches and
  // memory bandwidth the node's ranks share), independently of the others'. A collective
  // completes when the last of its ranks has issued it, so a rank that waits for one after
  // computing T seconds since its group last met waits, on average, E[max of n] x sigma(T)
  // beyond the mean rank: the expected maximum of n standard normals (1/sqrt(pi) for 2) times
  // the spread. The ranks take turns being last, so every meeting costs the step that much;
  // the fewer the meetings, the less (DDP meets a few times a step, ZeRO-3 at every unit).
  // On a CPU cluster whose node's ranks fill its slots one each (more ranks per slot: the
  // scheduler's share is in comm_core_s, measured that way); else 0. Beyond the curve's ends
  // the spread grows as sqrt(T) (a random walk, as measured within it).
  double straggler_seconds(double computed_s, int ranks) const;

 private:
  // The achieved FLOP/s of a GEMM or attention op from `curves` (device.`field`).
  double flops_rate(const std::map<DType, RateCurve>& curves, const OpCost& cost,
                    const char* field) const;

  double host_seconds(const OpCost& cost) const;

  const Cluster& cluster_;
  const DeviceRates& rates_;  // the device's, or its shared ones
  int ranks_per_node_;
  double slowdown_;
  DType compute_dtype_;
  // The cluster's comm_core_s and comm_blocking_s (or comm_core_s again) at this node's ranks
  // per slot, where its ranks fill the slots.
  std::optional<double> comm_core_s_, comm_blocking_s_;
  bool stragglers_ = false;  // the cluster's compute_spread_s applies (a rank per slot)
};

// The expected maximum of `n` independent standard normal variables (0 for n <= 1).
double expected_maximum_of_normals(int n);

}  // namespace loom::sim
