// The simulator's models (sim/): cluster descriptions and their errors, the device and network
// models' closed forms, and the timeline's streams: compute in order, each group's operations
// in order from their issue, and waits where the caller's code waits (docs/simulation.md).

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <thread>

#include "comm/process_group.h"
#include "comm/store/in_process_store.h"
#include "sim/cluster.h"
#include "sim/device_model.h"
#include "sim/network_model.h"
#include "sim/rank_exchange.h"
#include "sim/timeline.h"
#include "tensor/meta.h"

namespace loom::sim {
namespace {

// A cluster of round numbers: 4 devices per node of 100 GB/s, 2 NICs of 10 GB/s, 1 us per
// node step, 10 us per network step, 2 us per collective; GEMMs at 100 TFLOP/s up to 1e9 FLOP
// and 200 from 1e11; memory at 1,000 GB/s.
std::string test_cluster_json(const std::string& replace_from = "", const std::string& with = "") {
  std::string text = R"({
    "name": "test", "source": "round numbers for closed forms",
    "device": {"name": "round", "memory_gib": 16, "peak_tflops": {"bf16": 400, "f32": 50},
      "op_overhead_us": 1,
      "gemm_tflops": {"bf16": [[1e9, 100], [1e11, 200]], "f32": [[1e9, 25]]},
      "attention_tflops": {"bf16": [[1e9, 40]], "f32": [[1e9, 10]]},
      "memory_gbps": [[1e6, 1000]]},
    "node": {"devices": 4, "compute_slots": 4, "busbw_gbps": 100, "latency_us": 1},
    "network": {"nics_per_node": 2, "nic_gbps": 10, "latency_us": 10, "topology": "fat-tree"},
    "collective_base_latency_us": 2,
    "host": {"pcie_gbps": 20}
  })";
  if (!replace_from.empty()) {
    const size_t at = text.find(replace_from);
    EXPECT_NE(at, std::string::npos) << replace_from;
    text.replace(at, replace_from.size(), with);
  }
  return text;
}

Cluster test_cluster() { return parse_cluster(test_cluster_json(), "test"); }

void expect_error(const std::string& json, const std::string& message) {
  try {
    parse_cluster(json, "bad.json");
    ADD_FAILURE() << "no error; expected one naming " << message;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad.json"), std::string::npos) << e.what();
  }
}

TEST(SimCluster, EveryPresetLoadsAndHasItsSource) {
  ASSERT_EQ(cluster_presets(), (std::vector<std::string>{"dgx-a100", "dgx-h100", "this-machine"}));
  for (const std::string& name : cluster_presets()) {
    const Cluster c = load_cluster(name);
    EXPECT_EQ(c.name, name);
    EXPECT_GT(c.source.size(), 100u) << name << ": the source says where each number comes from";
    EXPECT_GT(c.device.peak_flops.at(DType::BF16), 0);
  }
  EXPECT_EQ(load_cluster("dgx-h100").nics_per_node, 8);
}

TEST(SimCluster, TheFileIsReadWithItsUnits) {
  const Cluster c = test_cluster();
  EXPECT_DOUBLE_EQ(c.device.memory_bytes, 16.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(c.device.peak_flops.at(DType::BF16), 400e12);
  EXPECT_DOUBLE_EQ(c.device.op_overhead_s, 1e-6);
  EXPECT_DOUBLE_EQ(c.intra_node.bytes_per_s, 100e9);
  EXPECT_DOUBLE_EQ(c.nic.latency_s, 10e-6);
  EXPECT_DOUBLE_EQ(c.pcie_bytes_per_s, 20e9);
}

TEST(SimCluster, BadDescriptionsNameTheirField) {
  expect_error(test_cluster_json(R"("busbw_gbps": 100,)", ""), "node.busbw_gbps is missing");
  expect_error(test_cluster_json(R"("memory_gib": 16,)", R"("memory_gib": 16, "code_path": "tpu",)"),
               "device.code_path must be \"cpu\" or \"cuda\", not \"tpu\"");
  EXPECT_TRUE(parse_cluster(test_cluster_json(R"("memory_gib": 16,)",
                                              R"("memory_gib": 16, "code_path": "cuda",)"),
                            "cuda")
                  .device.cuda_code_path);
  EXPECT_FALSE(test_cluster().device.cuda_code_path);
  expect_error(test_cluster_json(R"("devices": 4)", R"("devices": 0)"),
               "node.devices must be more than 0");
  expect_error(test_cluster_json(R"("devices": 4)", R"("devices": 2.5)"),
               "node.devices must be a whole number");
  expect_error(test_cluster_json(R"("nic_gbps": 10)", R"("nic_gbps": "fast")"),
               "network.nic_gbps must be a number");
  expect_error(test_cluster_json(R"([[1e9, 100], [1e11, 200]])", R"([[1e11, 100], [1e9, 200]])"),
               "device.gemm_tflops.bf16[1] has size");
  expect_error(test_cluster_json(R"("f32": [[1e9, 25]])", R"("f32": [[1e9, -25]])"),
               "device.gemm_tflops.f32[0] must have a size above 0 and a rate above 0");
  expect_error(test_cluster_json(R"("attention_tflops": {"bf16": [[1e9, 40]], )",
                                 R"("attention_tflops": {)"),
               "device.attention_tflops.bf16 is missing");
  expect_error(test_cluster_json(R"("fat-tree")", R"("torus")"), "network.topology must be");
  expect_error(test_cluster_json(R"("peak_tflops": {"bf16")", R"("peak_tflops": {"bf17")"),
               "device.peak_tflops.bf17 is not a dtype");
  expect_error("{", "not valid JSON");
  try {
    load_cluster("dgx-z100");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no such preset (presets: dgx-a100, dgx-h100, "
                                         "this-machine"),
              std::string::npos)
        << e.what();
  }
}

TEST(SimCluster, RateCurvesInterpolateInLogSize) {
  const RateCurve curve({{1e9, 100}, {1e11, 200}});
  EXPECT_DOUBLE_EQ(curve.at(1e3), 100);   // held below
  EXPECT_DOUBLE_EQ(curve.at(1e10), 150);  // halfway in log
  EXPECT_DOUBLE_EQ(curve.at(1e12), 200);  // held above
}

OpCost gemm(double flops, DType dtype) {
  return {.op = "matmul", .op_class = OpClass::Gemm, .flops = flops, .dtype = dtype};
}

TEST(SimDeviceModel, OpsTakeTheirWorkOverTheCurvesRatePlusTheOverhead) {
  const Cluster c = test_cluster();
  const DeviceModel device(c, /*ranks_per_node=*/4);
  EXPECT_DOUBLE_EQ(device.seconds(gemm(1e11, DType::BF16)), 1e-6 + 1e11 / 200e12);
  EXPECT_DOUBLE_EQ(device.seconds(gemm(1e9, DType::F32)), 1e-6 + 1e9 / 25e12);
  const OpCost add{.op = "add", .op_class = OpClass::Elementwise, .bytes_read = 8e6,
                   .bytes_written = 4e6};
  EXPECT_DOUBLE_EQ(device.seconds(add), 1e-6 + 12e6 / 1000e9);
  const OpCost to_host{.op = "copy_across_devices", .op_class = OpClass::Transfer,
                       .bytes_read = 2e9, .bytes_written = 2e9};
  EXPECT_DOUBLE_EQ(device.seconds(to_host), 1e-6 + 2e9 / 20e9);
  // Under bf16 autocast the meta device's f32 products run as a GPU runs them: in bf16.
  const DeviceModel mixed(c, 4, DType::BF16);
  EXPECT_DOUBLE_EQ(mixed.seconds(gemm(1e11, DType::F32)), 1e-6 + 1e11 / 200e12);
  // Eight ranks on four compute slots take twice as long.
  EXPECT_DOUBLE_EQ(DeviceModel(c, 8).seconds(add), 2 * device.seconds(add));
  EXPECT_DOUBLE_EQ(device.peak_flops(DType::BF16), 400e12);
  EXPECT_THROW(device.seconds(gemm(1e9, DType::F16)), Error);
}

TEST(SimDeviceModel, NamedOpsTakeTheirOwnCurves) {
  const Cluster c = parse_cluster(
      test_cluster_json(R"("memory_gbps": [[1e6, 1000]]})",
                        R"("memory_gbps": [[1e6, 1000]], "ops_gbps": {"gelu": [[1e6, 10]]},
                           "ops_tflops": {"CausalAttention": [[1e9, 5]],
                                          "causal_attention@d64": [[1e9, 7]]}})"),
      "named");
  const DeviceModel device(c, 4);
  const OpCost gelu{.op = "gelu", .op_class = OpClass::Elementwise, .bytes_read = 1e6};
  EXPECT_DOUBLE_EQ(device.seconds(gelu), 1e-6 + 1e6 / 10e9);
  OpCost add = gelu;
  add.op = "add";
  EXPECT_DOUBLE_EQ(device.seconds(add), 1e-6 + 1e6 / 1000e9);
  const OpCost backward{.op = "CausalAttention", .op_class = OpClass::Attention, .flops = 1e9,
                        .dtype = DType::BF16};
  EXPECT_DOUBLE_EQ(device.seconds(backward), 1e-6 + 1e9 / 5e12);
  OpCost forward = backward;
  forward.op = "causal_attention";
  EXPECT_DOUBLE_EQ(device.seconds(forward), 1e-6 + 1e9 / 40e12);
  forward.dims = {2, 4, 128, 64};  // head dimension 64: its own curve
  EXPECT_DOUBLE_EQ(device.seconds(forward), 1e-6 + 1e9 / 7e12);
  expect_error(test_cluster_json(R"("memory_gbps": [[1e6, 1000]]})",
                                 R"("memory_gbps": [[1e6, 1000]], "ops_gbps": {"gelu": 3}})"),
               "device.ops_gbps.gelu must be a non-empty list");
}

// device.shared: the rates measured with every slot busy apply when a node runs more than one
// rank; one rank alone has the device's own. Its fields are checked as the device's are.
TEST(SimDeviceModel, RanksSharingANodeTakeItsSharedRates) {
  const std::string shared = R"("memory_gbps": [[1e6, 1000]], "shared": {"op_overhead_us": 2,
      "gemm_tflops": {"bf16": [[1e9, 50]], "f32": [[1e9, 20]]},
      "attention_tflops": {"bf16": [[1e9, 30]], "f32": [[1e9, 8]]},
      "memory_gbps": [[1e6, 500]], "ops_gbps": {"gelu": [[1e6, 5]]}}})";
  const Cluster c = parse_cluster(test_cluster_json(R"("memory_gbps": [[1e6, 1000]]})", shared),
                                  "shared");
  const OpCost add{.op = "add", .op_class = OpClass::Elementwise, .bytes_read = 1e6};
  EXPECT_DOUBLE_EQ(DeviceModel(c, 1).seconds(add), 1e-6 + 1e6 / 1000e9);
  EXPECT_DOUBLE_EQ(DeviceModel(c, 2).seconds(add), 2e-6 + 1e6 / 500e9);
  OpCost gelu = add;
  gelu.op = "gelu";
  EXPECT_DOUBLE_EQ(DeviceModel(c, 4).seconds(gelu), 2e-6 + 1e6 / 5e9);
  EXPECT_DOUBLE_EQ(DeviceModel(c, 4).seconds(gemm(1e9, DType::F32)), 2e-6 + 1e9 / 20e12);
  expect_error(test_cluster_json(R"("memory_gbps": [[1e6, 1000]]})",
                                 R"("memory_gbps": [[1e6, 1000]], "shared": {"op_overhead_us": 0,
                                    "gemm_tflops": {"bf16": [[1e9, 50]]},
                                    "attention_tflops": {"bf16": [[1e9, 30]], "f32": [[1e9, 8]]},
                                    "memory_gbps": [[1e6, 500]]}})"),
               "device.shared.gemm_tflops.f32 is missing");
}

TEST(SimDeviceModel, HostOpsShareTheNodesHostAndCpuClustersUseTheirDevice) {
  const Cluster gpu = parse_cluster(test_cluster_json(R"("pcie_gbps": 20})",
                                                      R"("pcie_gbps": 20, "memory_gbps": [[1e6, 10]]})"),
                                    "with-host");
  const OpCost adamw{.op = "adamw", .op_class = OpClass::Optimizer, .bytes_read = 6e7,
                     .bytes_written = 4e7, .on_host = true};
  // 4 ranks of a node share its 10 GB/s: 2.5 each; no device overhead.
  EXPECT_DOUBLE_EQ(DeviceModel(gpu, 4).seconds(adamw), 1e8 / 2.5e9);
  // Without a host section the host is the device (a CPU cluster).
  EXPECT_DOUBLE_EQ(DeviceModel(test_cluster(), 4).seconds(adamw), 1e-6 + 1e8 / 1000e9);
  expect_error(test_cluster_json(R"("pcie_gbps": 20})", R"("pcie_gbps": 20, "ops_gbps": {}})"),
               "host.ops_gbps needs host.memory_gbps");
}

comm::CommCost collective(const std::string& op, int n, double bytes) {
  comm::CommCost cost;
  cost.op = op;
  cost.group = "g";
  cost.group_size = n;
  cost.bytes = static_cast<int64_t>(bytes);
  return cost;
}

TEST(SimNetworkModel, RingCollectivesWithinANode) {
  const Cluster c = test_cluster();
  const NetworkModel network(c, 0);
  const double s = 4e9, b = 100e9, a = 1e-6, base = 2e-6;
  CollectiveTime t = network.time(collective("allreduce", 4, s));
  EXPECT_EQ(t.algorithm, CollectiveAlgorithm::Ring);
  EXPECT_DOUBLE_EQ(t.seconds, base + 2 * (0.75 * s / b + 3 * a));
  EXPECT_DOUBLE_EQ(network.time(collective("all_gather", 4, s)).seconds, base + 0.75 * s / b + 3 * a);
  EXPECT_DOUBLE_EQ(network.time(collective("reduce_scatter", 2, s)).seconds, base + 0.5 * s / b + a);
  EXPECT_DOUBLE_EQ(network.time(collective("broadcast", 4, s)).seconds, base + s / b + 3 * a);
  EXPECT_DOUBLE_EQ(network.time(collective("allreduce", 1, s)).seconds, 0);
}

TEST(SimNetworkModel, AcrossNodesTheNicsBoundTheBandwidthAndTreesWinSmallAllreduces) {
  const Cluster c = test_cluster();
  const NetworkModel network(c, 0);
  // 64 ranks on 16 nodes: the bus bandwidth is 2 NICs x 10 GB/s, steps cost the NIC's 10 us.
  const double n = 64, bus = 20e9, base = 2e-6;
  const double s = 1e9;
  CollectiveTime big = network.time(collective("allreduce", 64, s));
  EXPECT_EQ(big.algorithm, CollectiveAlgorithm::Ring);
  EXPECT_DOUBLE_EQ(big.seconds, base + 2 * ((n - 1) / n * s / bus + (n - 1) * 10e-6));
  CollectiveTime small = network.time(collective("allreduce", 64, 1024));
  EXPECT_EQ(small.algorithm, CollectiveAlgorithm::Tree);
  EXPECT_DOUBLE_EQ(small.seconds,
                   base + 2 * (n - 1) / n * 1024 / (0.92 * bus) + 2 * (4 * 10e-6 + 3 * 1e-6));
  // Point to point: NVLink within the node, the rank's share of its node's NICs across (2 NICs
  // of 10 GB/s for 4 devices: 5 GB/s).
  comm::CommCost send = collective("send", 64, 1e9);
  send.peer = 3;
  EXPECT_DOUBLE_EQ(network.time(send).seconds, 1e9 / 100e9 + 1e-6);
  send.peer = 4;
  EXPECT_DOUBLE_EQ(network.time(send).seconds, 1e9 / 5e9 + 10e-6);
}

// A mesh's subgroups sit where their members' world ranks put them: a group with one rank on
// each of 8 nodes crosses the network with its share of each node's NICs (2 x 10 GB/s for 4
// devices: 5 GB/s), a group of the 4 devices of one node stays on NVLink.
TEST(SimNetworkModel, SubgroupsArePlacedByTheirWorldRanks) {
  const Cluster c = test_cluster();
  const NetworkModel network(c, 0);
  comm::CommCost across = collective("allreduce", 8, 1e9);
  across.world_ranks = std::make_shared<const std::vector<int>>(
      std::vector<int>{0, 4, 8, 12, 16, 20, 24, 28});
  const CollectiveTime t = network.time(across);
  EXPECT_EQ(t.algorithm, CollectiveAlgorithm::Ring);
  EXPECT_DOUBLE_EQ(t.seconds, 2e-6 + 2 * (7.0 / 8 * 1e9 / 5e9 + 7 * 10e-6));
  comm::CommCost within = collective("allreduce", 4, 1e9);
  within.world_ranks = std::make_shared<const std::vector<int>>(std::vector<int>{4, 5, 6, 7});
  EXPECT_DOUBLE_EQ(network.time(within).seconds, 2e-6 + 2 * (0.75 * 1e9 / 100e9 + 3 * 1e-6));
  // A send to the group's rank 1 is a send to world rank 4, on the next node.
  comm::CommCost send = collective("send", 8, 1e9);
  send.world_ranks = across.world_ranks;
  send.peer = 1;
  EXPECT_DOUBLE_EQ(network.time(send).seconds, 1e9 / 5e9 + 10e-6);
}

TEST(SimNetworkModel, AGroupBeyondOneNodeNeedsANetwork) {
  const Cluster c = parse_cluster(
      test_cluster_json(R"("nics_per_node": 2, "nic_gbps": 10, "latency_us": 10, "topology": "fat-tree")",
                        R"("nics_per_node": 0)"),
      "one-node");
  const NetworkModel network(c, 0);
  EXPECT_NO_THROW(network.time(collective("allreduce", 4, 1e6)));
  try {
    network.time(collective("allreduce", 8, 1e6));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no network (network.nics_per_node 0): a group of 8 "
                                         "ranks needs 2 nodes of 4 devices"),
              std::string::npos)
        << e.what();
  }
}

// A sim group of `size` ranks with the timeline installed.
std::shared_ptr<comm::ProcessGroup> sim_group(int size, const std::string& name = "g",
                                              int rank = 0) {
  return std::make_shared<comm::ProcessGroup>(
      rank, size, std::make_shared<comm::InProcessStore>(),
      comm::GroupOptions{.backend = "sim", .device = Device::meta()}, name);
}

// Reports a compute op of `seconds` on the test cluster (memory-bound bytes at 1,000 GB/s,
// less the 1 us overhead).
void compute(double seconds) {
  const Tensor t = Tensor::empty({static_cast<int64_t>((seconds - 1e-6) * 1000e9 / 8)}, DType::F32,
                                 Device::meta());
  record_meta_op("work", OpClass::Elementwise, 0, {t}, {t});
}

TEST(SimTimeline, CommunicationOverlapsComputeUntilTheCallerWaits) {
  // A Work's completion is a Clock::time_point: simulated times pass through nanoseconds.
  constexpr double kNanosecond = 1e-9;
  const Cluster c = test_cluster();
  Timeline timeline(c, 0, 4, DType::F32);
  TimelineScope scope(timeline);
  std::shared_ptr<comm::ProcessGroup> group = sim_group(4);
  Tensor grads = Tensor::empty({1 << 20}, DType::F32, Device::meta());  // 4 MiB
  const double allreduce = 2e-6 + 2 * (0.75 * 4194304 / 100e9 + 3e-6);
  compute(100e-6);
  comm::WorkPtr work = group->allreduce(grads);  // issued at 100 us, async
  EXPECT_TRUE(work->is_completed());             // (at issue: its times are simulated)
  compute(20e-6);  // hides 20 us of it
  work->wait();
  Timeline::Totals t = timeline.totals();
  EXPECT_NEAR(t.now, 100e-6 + allreduce, kNanosecond);
  EXPECT_NEAR(t.exposed_comm, allreduce - 20e-6, kNanosecond);
  EXPECT_NEAR(t.compute, 120e-6, kNanosecond);
  EXPECT_NEAR(t.comm_busy, allreduce, kNanosecond);
  // Operations of one group run in order: the second starts when the first ends, although
  // both were issued at once; a second group's stream is its own.
  std::shared_ptr<comm::ProcessGroup> other = sim_group(4, "other");
  comm::WorkPtr first = group->allreduce(grads);
  comm::WorkPtr second = group->allreduce(grads);
  comm::WorkPtr beside = other->allreduce(grads);
  second->wait();
  beside->wait();
  EXPECT_NEAR(timeline.totals().now, t.now + 2 * allreduce, kNanosecond);
  // A synchronous call waits at once; a wait on a finished operation costs nothing.
  const double before = timeline.totals().now;
  group->allreduce(grads, {.async_op = false});
  EXPECT_NEAR(timeline.totals().now, before + allreduce, kNanosecond);
  first->wait();
  EXPECT_NEAR(timeline.totals().now, before + allreduce, kNanosecond);
  EXPECT_EQ(timeline.comm_log().size(), 5u);
}

// On a CPU cluster whose ranks fill the node's cores, a communication operation takes core time
// from its rank's compute: node.comm_core_us plus its transfer, slowed as the rank's ops are
// (4 ranks on 2 slots: twice); with a core to spare, or on a GPU cluster, nothing.
TEST(SimTimeline, OnAFullCpuNodeCommunicationTakesCoreTimeFromCompute) {
  constexpr double kNanosecond = 1e-9;
  const std::string node = R"("compute_slots": 4, "busbw_gbps": 100, "latency_us": 1},)";
  const Cluster c = parse_cluster(
      test_cluster_json(node, R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
                                 "comm_core_us": 50},)"),
      "cpu");
  EXPECT_DOUBLE_EQ(c.comm_core_s.at(1), 50e-6);
  EXPECT_DOUBLE_EQ(c.comm_core_s.at(4), 50e-6);  // a number holds at every ranks per slot
  for (const auto& [ranks, charged_per_us] :
       {std::pair{4, 2.0}, std::pair{2, 1.0}, std::pair{1, 0.0}}) {
    Timeline timeline(c, 0, ranks, DType::F32);
    TimelineScope scope(timeline);
    std::shared_ptr<comm::ProcessGroup> group = sim_group(ranks);
    Tensor grads = Tensor::empty({1 << 20}, DType::F32, Device::meta());  // 4 MiB
    const double n = ranks;
    const double allreduce =
        ranks == 1 ? 0 : 2e-6 + 2 * ((n - 1) / n * 4194304 / 100e9 + (n - 1) * 1e-6);
    const double charged = charged_per_us * (50e-6 + allreduce);
    group->allreduce(grads)->wait();
    const Timeline::Totals t = timeline.totals();
    EXPECT_NEAR(t.compute, charged, kNanosecond) << ranks << " ranks";
    // The wait ends at the operation's end or after the charge, whichever is later.
    EXPECT_NEAR(t.now, std::max(allreduce, charged), kNanosecond) << ranks << " ranks";
  }
  expect_error(test_cluster_json(node, R"("compute_slots": 4, "busbw_gbps": 100, "latency_us": 1,
                                          "comm_core_us": -1},)"),
               "node.comm_core_us must be");
  std::string gpu = test_cluster_json(node, R"("compute_slots": 4, "busbw_gbps": 100,
                                               "latency_us": 1, "comm_core_us": 5},)");
  gpu.replace(gpu.find(R"("pcie_gbps": 20})"), 17,
              R"("pcie_gbps": 20, "memory_gbps": [[1e6, 10]]})");
  expect_error(gpu, "node.comm_core_us applies to a CPU cluster");
}

// node.comm_core_us as a curve by ranks per compute slot: a call on a node whose cores are
// shared by several ranks each also waits for peers the scheduler set aside, so it costs more
// than one on a node with a rank per core. Interpolated in log(ranks per slot).
TEST(SimTimeline, CommunicationCoreTimeFollowsRanksPerComputeSlot) {
  constexpr double kNanosecond = 1e-9;
  const std::string node = R"("compute_slots": 4, "busbw_gbps": 100, "latency_us": 1},)";
  const Cluster c = parse_cluster(
      test_cluster_json(node, R"("compute_slots": 1, "busbw_gbps": 100, "latency_us": 1,
                                 "comm_core_us": [[1, 10], [4, 50]]},)"),
      "cpu");
  // One core for the node's ranks: 2 ranks take 30 us each (halfway in log), 4 ranks 50.
  for (const auto& [ranks, core_us] : {std::pair{2, 30.0}, std::pair{4, 50.0}}) {
    Timeline timeline(c, 0, ranks, DType::F32);
    TimelineScope scope(timeline);
    std::shared_ptr<comm::ProcessGroup> group = sim_group(ranks);
    Tensor grads = Tensor::empty({1 << 20}, DType::F32, Device::meta());  // 4 MiB
    const double n = ranks, slowdown = n;
    const double allreduce = 2e-6 + 2 * ((n - 1) / n * 4194304 / 100e9 + (n - 1) * 1e-6);
    group->allreduce(grads)->wait();
    EXPECT_NEAR(timeline.totals().compute, slowdown * (core_us * 1e-6 + allreduce), kNanosecond)
        << ranks << " ranks";
  }
  expect_error(test_cluster_json(node, R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
                                          "comm_core_us": [[1, 10], [1, 50]]},)"),
               "node.comm_core_us[1] has size 1, not above the size before it");
  expect_error(test_cluster_json(node, R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
                                          "comm_core_us": [[1, -3]]},)"),
               "node.comm_core_us[0] must have a size above 0 and a rate of 0 or more");
}

// A call its rank waits for at once (nothing computed between) costs the cores the hand-off
// of ranks that all wait (node.comm_blocking_us); one overlapped with the rank's compute costs
// what it takes from a computing rank (node.comm_core_us). The charge comes at the first wait;
// a call never waited for is charged nothing.
TEST(SimTimeline, ACallOverlappedWithComputeCostsTheLoadedCoreTime) {
  constexpr double kNanosecond = 1e-9;
  const std::string node = R"("compute_slots": 4, "busbw_gbps": 100, "latency_us": 1},)";
  const Cluster c = parse_cluster(
      test_cluster_json(node, R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
                                 "comm_core_us": 50, "comm_blocking_us": [[1, 10], [4, 30]]},)"),
      "cpu");
  Timeline timeline(c, 0, 2, DType::F32);  // a rank per slot: 50 us loaded, 10 blocking
  TimelineScope scope(timeline);
  std::shared_ptr<comm::ProcessGroup> group = sim_group(2);
  Tensor grads = Tensor::empty({1 << 20}, DType::F32, Device::meta());  // 4 MiB
  const double allreduce = 2e-6 + 2 * (0.5 * 4194304 / 100e9 + 1e-6);
  group->allreduce(grads)->wait();  // blocking
  EXPECT_NEAR(timeline.totals().compute, 10e-6 + allreduce, kNanosecond);
  comm::WorkPtr overlapped = group->allreduce(grads);
  EXPECT_NEAR(timeline.totals().compute, 10e-6 + allreduce, kNanosecond);  // (not yet)
  compute(300e-6);
  overlapped->wait();
  overlapped->wait();  // (charged once)
  EXPECT_NEAR(timeline.totals().compute, 10e-6 + allreduce + 300e-6 + 50e-6 + allreduce,
              kNanosecond);
  const double before = timeline.totals().compute;
  comm::WorkPtr never_waited = group->allreduce(grads);
  compute(100e-6);
  never_waited.reset();
  EXPECT_NEAR(timeline.totals().compute, before + 100e-6, kNanosecond);
  expect_error(test_cluster_json(node, R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
                                          "comm_blocking_us": 10},)"),
               "node.comm_blocking_us needs node.comm_core_us");
}

// Note [Stragglers at a meeting]: a collective's first wait waits, beyond the operation, for
// the last of its group's ranks, E[max of n standard normals] x the spread of the computation
// since the rank's last meeting; on a CPU node whose ranks fill its cores one each.
TEST(SimTimeline, ACollectiveWaitsForTheStragglersOfItsGroup) {
  constexpr double kNanosecond = 1e-9;
  const double inverse_root_pi = 1 / std::sqrt(std::numbers::pi);
  EXPECT_EQ(expected_maximum_of_normals(1), 0);
  EXPECT_NEAR(expected_maximum_of_normals(2), inverse_root_pi, 1e-9);
  EXPECT_NEAR(expected_maximum_of_normals(3), 1.5 * inverse_root_pi, 1e-9);
  EXPECT_NEAR(expected_maximum_of_normals(8), 1.4236003060, 1e-9);
  const std::string node = R"("compute_slots": 4, "busbw_gbps": 100, "latency_us": 1},)";
  const std::string cpu_node = R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
      "comm_core_us": 50, "comm_blocking_us": 10, "compute_spread_us": [[1000, 100]]},)";
  const Cluster c = parse_cluster(test_cluster_json(node, cpu_node), "cpu");
  Tensor grads = Tensor::empty({1 << 10}, DType::F32, Device::meta());  // 4 KiB: done at once
  {
    Timeline timeline(c, 0, 2, DType::F32);  // a rank per core
    TimelineScope scope(timeline);
    std::shared_ptr<comm::ProcessGroup> pair = sim_group(2), alone = sim_group(1, "alone");
    compute(1e-3);
    pair->allreduce(grads)->wait();  // 1 ms since the start: the curve's 100 us
    EXPECT_NEAR(timeline.totals().exposed_comm, 100e-6 * inverse_root_pi, kNanosecond);
    compute(4e-3);
    pair->allreduce(grads)->wait();  // beyond the curve, as sqrt(T): 200 us
    EXPECT_NEAR(timeline.totals().exposed_comm, 300e-6 * inverse_root_pi, kNanosecond);
    compute(250e-6);
    pair->allreduce(grads)->wait();  // below it: 50 us
    EXPECT_NEAR(timeline.totals().exposed_comm, 350e-6 * inverse_root_pi, kNanosecond);
    pair->allreduce(grads)->wait();  // nothing computed since the last meeting
    compute(1e-3);
    alone->allreduce(grads)->wait();  // a group of one meets nobody
    EXPECT_NEAR(timeline.totals().exposed_comm, 350e-6 * inverse_root_pi, kNanosecond);
  }
  {
    Timeline timeline(c, 0, 4, DType::F32);  // two ranks per core: in comm_core_us already
    TimelineScope scope(timeline);
    compute(4e-3);
    sim_group(4)->allreduce(grads)->wait();
    EXPECT_EQ(timeline.totals().exposed_comm, 0);
  }
  expect_error(test_cluster_json(node, R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
                                          "compute_spread_us": [[1000, 100]]},)"),
               "node.compute_spread_us needs node.comm_core_us");
  expect_error(test_cluster_json(node, R"("compute_slots": 2, "busbw_gbps": 100, "latency_us": 1,
                                          "comm_core_us": 50, "compute_spread_us": [[0, 1]]},)"),
               "node.compute_spread_us[0] must have a size above 0");
}

// split_by: a simulated group makes its subgroup from the assignment alone, ordered by (key,
// rank) as split() orders, and knows where its members are in the world.
TEST(SimTimeline, ASimulatedGroupSplitsByAnAssignment) {
  comm::CommCostLog log;
  comm::CommCostSink* previous = comm::set_comm_cost_sink(&log);
  std::shared_ptr<comm::ProcessGroup> world = sim_group(8);
  EXPECT_THROW(world->split(0, 0), Error);  // it cannot exchange colors
  std::shared_ptr<comm::ProcessGroup> even =
      world->split_by([](int r) { return std::pair{r % 2, -r}; });  // keys descending
  ASSERT_NE(even, nullptr);
  EXPECT_EQ(even->size(), 4);
  EXPECT_EQ(even->rank(), 3);  // rank 0 has the largest key of {0, 2, 4, 6}
  std::shared_ptr<comm::ProcessGroup> pair = even->split_by([](int r) { return std::pair{r / 2, r}; });
  EXPECT_EQ(pair->size(), 2);
  EXPECT_EQ(pair->rank(), 1);
  EXPECT_EQ(world->split_by([](int r) { return std::pair{r == 0 ? -1 : 0, r}; }), nullptr);
  Tensor t = Tensor::empty({4}, DType::F32, Device::meta());
  even->allreduce(t)->wait();
  pair->allreduce(t)->wait();
  comm::set_comm_cost_sink(previous);
  ASSERT_EQ(log.costs().size(), 2u);
  EXPECT_EQ(*log.costs()[0].world_ranks, (std::vector<int>{6, 4, 2, 0}));
  EXPECT_EQ(*log.costs()[1].world_ranks, (std::vector<int>{2, 0}));  // even's ranks 2 and 3
}

// Two ranks of four simulated together, each on its own thread (a pipeline's stages): a send
// arrives at its start plus the network's time and the receive that takes it waits for it (the
// receiver's bubble); a collective among both starts when the later of them is ready; a host
// tensor's values pass; each thread counts its own meta memory.
TEST(SimTimeline, RanksSimulatedTogetherMeetInAnExchange) {
  constexpr double kNanosecond = 1e-9;
  const Cluster c = test_cluster();
  RankExchange exchange({0, 1});
  Tensor payload = Tensor::empty({1 << 20}, DType::F32, Device::meta());  // 4 MiB
  const double transfer = NetworkModel(c, 0).time({.op = "send", .group = "world", .group_size = 4,
                                                    .bytes = 4 << 20, .peer = 1,
                                                    .world_ranks = nullptr, .host_tensor = {}})
                              .seconds;
  Tensor all = Tensor::empty({1 << 10}, DType::F32, Device::meta());
  const double allreduce = NetworkModel(c, 0).time({.op = "allreduce", .group = "world",
                                                     .group_size = 4, .bytes = 4 << 10, .peer = -1,
                                                     .world_ranks = nullptr, .host_tensor = {}})
                               .seconds;
  Timeline::Totals totals[2];
  std::vector<int64_t> header;
  size_t meta_bytes[2] = {};
  const auto rank_thread = [&](int rank) {
    MetaAllocatorScope memory;
    Timeline timeline(c, rank, 4, DType::F32, nullptr, &exchange);
    TimelineScope scope(timeline);
    std::shared_ptr<comm::ProcessGroup> world = sim_group(4, "world", rank);
    Tensor mine = Tensor::empty({256 * (rank + 1)}, DType::F32, Device::meta());
    meta_bytes[rank] = allocator_for(Device::meta()).stats().current_bytes;
    if (rank == 0) {
      compute(100e-6);
      world->send(Tensor::from_vector(std::vector<int64_t>{7, 8, 9}, {3}), 1);
      world->send(payload, 1);  // starts at 100 us: its stream is free
      compute(10e-6);
    } else {
      Tensor words = Tensor::empty({3}, DType::I64);
      world->recv(words, 0)->wait();
      header = words.to_vector<int64_t>();
      comm::WorkPtr received = world->recv(payload, 0);  // posted at once, waited for later
      compute(10e-6);
      received->wait();
    }
    world->allreduce(all)->wait();
    totals[rank] = timeline.totals();
  };
  std::thread second(rank_thread, 1);
  rank_thread(0);
  second.join();
  EXPECT_EQ(header, (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(meta_bytes[0], 1024u);
  EXPECT_EQ(meta_bytes[1], 2048u);
  // The header (24 bytes) and the payload leave in turn on rank 0's stream from 100 us.
  const double header_transfer =
      NetworkModel(c, 0).time({.op = "send", .group = "world", .group_size = 4, .bytes = 24,
                               .peer = 1, .world_ranks = nullptr, .host_tensor = {}})
          .seconds;
  const double arrival = 100e-6 + header_transfer + transfer;
  EXPECT_NEAR(totals[1].compute, 10e-6, kNanosecond);
  // Rank 1 waited for the header until it arrived, computed 10 us, then waited for the payload.
  EXPECT_NEAR(totals[1].bubble + totals[1].compute + totals[1].exposed_comm, totals[1].now,
              kNanosecond);
  // Both ranks leave the allreduce together: it started when the later of them was ready.
  const double later = std::max(110e-6, arrival);
  EXPECT_NEAR(totals[0].now, later + allreduce, kNanosecond);
  EXPECT_NEAR(totals[1].now, later + allreduce, kNanosecond);
  EXPECT_NEAR(totals[0].exposed_comm, later + allreduce - 110e-6, kNanosecond);
  EXPECT_NEAR(totals[1].bubble, arrival - 10e-6, kNanosecond);
}

// A rank that fails wakes the others with its error instead of leaving them waiting; a wait
// that nobody will answer ends at the timeout, naming what it waited for.
TEST(SimTimeline, AnExchangeFailsItsWaitersInsteadOfHanging) {
  RankExchange aborted({0, 1});
  std::thread failing([&] { aborted.abort("stage 1 failed: out of ideas"); });
  try {
    aborted.meet("world allreduce #0", 0, 2);
    FAIL() << "meet returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stage 1 failed: out of ideas"), std::string::npos);
  }
  failing.join();
  RankExchange quiet({0, 1}, std::chrono::milliseconds(50));
  try {
    quiet.message({"link", 0, 1}, 0);
    FAIL() << "message returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("message 0 from world rank 0 to 1 on link"),
              std::string::npos)
        << e.what();
  }
}

TEST(SimTimeline, TheTraceShowsOpsOperationsAndWaitsInSimulatedTime) {
  const Cluster c = test_cluster();
  strategies::Trace trace;
  Timeline timeline(c, 0, 4, DType::F32, &trace);
  TimelineScope scope(timeline);
  std::shared_ptr<comm::ProcessGroup> group = sim_group(4);
  Tensor grads = Tensor::empty({1 << 20}, DType::F32, Device::meta());
  compute(100e-6);
  group->allreduce(grads)->wait();
  std::vector<strategies::Trace::Event> events = trace.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].name, "work");
  EXPECT_EQ(events[0].ts, 0);
  EXPECT_EQ(events[0].dur, 100);
  EXPECT_EQ(events[1].name, "allreduce");
  EXPECT_EQ(events[1].category, "ring");
  EXPECT_EQ(events[1].ts, 100);
  EXPECT_NE(events[1].tid, strategies::Trace::kMainThread);
  EXPECT_EQ(events[2].category, "exposed communication");
  EXPECT_EQ(events[2].ts, 100);
  EXPECT_EQ(events[2].dur, events[1].dur);
}

}  // namespace
}  // namespace loom::sim
