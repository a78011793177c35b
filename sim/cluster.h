#pragma once
// A described cluster for the simulator (docs/simulation.md): its devices' compute and memory
// rates by op kind and size, its nodes' links, its network and its hosts. Read from a JSON
// file or a named preset (sim/clusters/*.json, built into the library); every number is
// checked on load and a missing or impossible one is an error naming its field.
//
//   sim::Cluster cluster = sim::load_cluster("dgx-h100");     // or a path to a .json file
//
// Units in the files are the ones their sources print (TFLOP/s, GB/s with GB = 1e9 bytes,
// microseconds); in memory everything is in FLOP/s, bytes/s, bytes and seconds.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"

namespace loom::sim {

// An achieved rate (or another measured value) that depends on an op's size: points (size,
// rate) with sizes increasing, interpolated linearly in log(size) between them and held at the
// end values beyond.
class RateCurve {
 public:
  RateCurve() = default;
  explicit RateCurve(std::vector<std::pair<double, double>> points);
  double at(double size) const;
  bool empty() const { return points_.empty(); }
  double first_size() const { return points_.empty() ? 0 : points_.front().first; }
  double last_size() const { return points_.empty() ? 0 : points_.back().first; }

 private:
  std::vector<std::pair<double, double>> points_;
};

// What a device achieves, by op kind and size.
struct DeviceRates {
  double op_overhead_s = 0;               // per op: a kernel launch, a dispatch
  std::map<DType, RateCurve> gemm_flops;  // achieved FLOP/s by one GEMM's FLOPs
  std::map<DType, RateCurve> attention_flops;  // achieved FLOP/s by one attention op's FLOPs
  RateCurve memory_bytes_per_s;  // bandwidth-bound ops: achieved bytes/s by bytes moved
  // Optional: curves of their own for named bandwidth-bound ops (OpCost::op: "gelu", its
  // backward "Gelu", "adamw", ...), where an op's rate differs from a plain copy's.
  std::map<std::string, RateCurve, std::less<>> op_bytes_per_s;
  // Optional: likewise, FLOP/s by FLOPs for named GEMM or attention ops ("causal_attention",
  // its backward "CausalAttention"), in place of their dtype's class curve; an attention op
  // takes "NAME@dD" for its head dimension D first ("causal_attention@d64").
  std::map<std::string, RateCurve, std::less<>> op_flops_per_s;
};

struct DeviceSpec : DeviceRates {  // the rates of one rank with its node to itself
  std::string name;
  double memory_bytes = 0;             // capacity, for the sweep's memory limit
  std::map<DType, double> peak_flops;  // the datasheet's dense peak by compute dtype, for MFU
  // Optional (device.code_path "cuda"; default "cpu"): a simulated rank's meta ops allocate as
  // Loom's CUDA code path does where it differs from the CPU's (MetaCudaPathScope).
  bool cuda_code_path = false;
  // Optional (device.shared): the rates measured while every compute slot of the node runs a
  // rank at once, where the devices share caches and memory bandwidth (a CPU's cores); the
  // device model takes them for a job with more than one rank on a node.
  std::shared_ptr<const DeviceRates> shared;
};

struct LinkSpec {
  double bytes_per_s = 0;  // achieved, one direction
  double latency_s = 0;    // per algorithm step
};

struct Cluster {
  std::string name;
  std::string source;  // where its numbers come from (commands, documents)
  DeviceSpec device;
  int devices_per_node = 1;
  // Ranks of one node beyond compute_slots share them (a CPU machine's cores): their compute
  // slows by ranks / slots. A GPU node has one slot per device.
  int compute_slots = 1;
  LinkSpec intra_node;  // a collective's bus bandwidth among one node's devices (NVLink)
  // Optional (node.comm_core_us; CPU clusters only): the core time one communication operation
  // takes from a rank that computes meanwhile, beyond its transfer, measured with every core
  // computing (loom-perf --compute-us), by ranks per compute slot (1: a core each; 4: four
  // ranks share each core, and a call also waits for peers the scheduler has set aside). Where
  // the node's ranks fill its compute slots, a rank's compute gives up that time and the
  // transfer's (the copies run on the same cores). Seconds; empty: none.
  RateCurve comm_core_s;
  // Optional (node.comm_blocking_us; needs comm_core_us): the same for an operation its rank
  // waits for at once, with nothing computed between the issue and the wait (a synchronous
  // call, a wait right after the issue): the hand-off to the progress thread and the wake-ups
  // between ranks that all wait, measured without computation (loom-perf -z 2). Empty: such
  // an operation takes comm_core_s as well.
  RateCurve comm_blocking_s;
  // Optional (node.compute_spread_us; needs comm_core_us): the standard deviation of a rank's
  // computation over an interval (seconds), by the interval's length (microseconds), measured with
  // a rank on every core (loom-sim-calibrate's shared round: the spread of the same ops' time
  // across its profiled steps). Ranks that compute the same work drift apart by it, and a
  // collective waits for the last of them (Note [Stragglers at a meeting], sim/device_model.h).
  // Empty: ranks keep in step.
  RateCurve compute_spread_s;
  int nics_per_node = 0;
  LinkSpec nic;          // one NIC, between nodes
  std::string topology;  // "fat-tree" or "rail": both full bisection (docs/simulation.md)
  double collective_base_latency_s = 0;  // per collective, on top of its steps
  double pcie_bytes_per_s = 0;           // device <-> host copies (offload)
  // The host's work (a rank's CPU ops: the offloaded optimizer), all of a node's ranks
  // sharing it: achieved bytes/s of the node by bytes, and named ops' own curves. Empty: the
  // host is the device (a CPU cluster), and host ops take the device's curves.
  RateCurve host_memory_bytes_per_s;
  std::map<std::string, RateCurve, std::less<>> host_op_bytes_per_s;
};

// A preset's name ("this-machine", "dgx-a100", "dgx-h100") or a path to a JSON file.
Cluster load_cluster(const std::string& preset_or_path);
// Parses a cluster description; `origin` names it in errors.
Cluster parse_cluster(const std::string& json_text, const std::string& origin);
std::vector<std::string> cluster_presets();

// A rank's compute dtype for MFU and the GEMM curves: the precision's ("bf16-mixed": bf16).
DType compute_dtype(const std::string& precision);

}  // namespace loom::sim
