#include "sim/network_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/tags.h"

namespace loom::sim {

const char* algorithm_name(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
    case CollectiveAlgorithm::None: return "none";
    case CollectiveAlgorithm::Ring: return "ring";
    case CollectiveAlgorithm::Tree: return "tree";
    case CollectiveAlgorithm::PointToPoint: return "p2p";
  }
  return "?";
}

NetworkModel::NetworkModel(const Cluster& cluster, int rank) : cluster_(cluster), rank_(rank) {}

// Note [Collective times]
// A group of n ranks spans `nodes` nodes with `local` ranks on each (packed from the first
// node, or where its members' world ranks put them: a mesh's subgroup). Its bus bandwidth B is
// the node's (NVLink) within one node; across nodes NCCL runs one ring (or tree) per NIC, so
// a node's NICs carry the traffic together; the node's groups (devices / local of them, all
// communicating alike in a symmetric job) share them: B = min(node bus bandwidth, NICs x NIC
// bandwidth x local / devices per node). With S the operation's whole buffer (allreduce: its input;
// all_gather: the gathered output; reduce_scatter: the scattered input) and alpha the
// per-step latency (the NIC's when the group crosses nodes, else the node's), NCCL's cost
// model (the form of src/graph/tuning.cc: a base latency, steps, bytes over bandwidth) gives:
//   ring allreduce       2 (n-1)/n S / B + 2 (n-1) alpha
//   tree allreduce       2 (n-1)/n S / (0.92 B) + 2 (log2(nodes) alpha_net + (local-1) alpha_node)
//                        (across nodes only: a double binary tree over nodes, chains inside;
//                        0.92 is NCCL's derating of tree bandwidth)
//   all_gather, reduce_scatter   (n-1)/n S / B + (n-1) alpha
//   broadcast, reduce    S / B + (n-1) alpha       (a pipelined ring)
//   all_to_all           the slower of its intra-node share over B_node and its inter-node
//                        share over the rank's part of the NICs, + (n-1) alpha
//   send, recv           S / link + alpha           (NVLink within a node, the rank's NICs across)
// each plus the collective base latency. An allreduce takes the faster of ring and tree, as
// NCCL's tuner picks the algorithm its model predicts fastest. Not modelled: NVLink SHARP
// (NVLS), CollNet, protocol choice (LL, LL128, Simple: one latency per link), contention
// between concurrent operations or with compute, and oversubscribed network cores.
namespace {

// How a group's members sit on the cluster's nodes.
struct Placement {
  int nodes = 1;  // the nodes its members are on
  int local = 1;  // members on each (the most on one)
};

Placement place(const comm::CommCost& cost, int devices_per_node) {
  const int n = cost.group_size;
  if (!cost.world_ranks) {  // ranks 0..n-1: packed from the first node
    return {.nodes = (n + devices_per_node - 1) / devices_per_node,
            .local = std::min(n, devices_per_node)};
  }
  std::map<int, int> per_node;
  for (const int r : *cost.world_ranks) ++per_node[r / devices_per_node];
  Placement p{.nodes = static_cast<int>(per_node.size()), .local = 0};
  for (const auto& [node, members] : per_node) p.local = std::max(p.local, members);
  return p;
}

}  // namespace

CollectiveTime NetworkModel::time(const comm::CommCost& cost) const {
  const int n = cost.group_size;
  const double size = static_cast<double>(cost.bytes);
  const Cluster& c = cluster_;
  if (cost.op == "send" || cost.op == "recv") {
    const int peer = cost.world_ranks ? (*cost.world_ranks)[static_cast<size_t>(cost.peer)] : cost.peer;
    const bool same_node = peer / c.devices_per_node == rank_ / c.devices_per_node;
    if (!same_node && c.nics_per_node == 0) {
      tag::kLoomSim.fail("cluster ", c.name, " has no network (network.nics_per_node 0), but rank ",
                         rank_, " sends to rank ", peer, " on another node");
    }
    // Across nodes: the rank's share of its node's NICs (every rank of a symmetric job sends).
    const LinkSpec link =
        same_node ? c.intra_node
                  : LinkSpec{.bytes_per_s = c.nics_per_node * c.nic.bytes_per_s / c.devices_per_node,
                             .latency_s = c.nic.latency_s};
    return {size / link.bytes_per_s + link.latency_s, CollectiveAlgorithm::PointToPoint};
  }
  if (n <= 1) return {};
  const auto [nodes, local] = place(cost, c.devices_per_node);
  if (nodes > 1 && c.nics_per_node == 0) {
    tag::kLoomSim.fail("cluster ", c.name, " has no network (network.nics_per_node 0): a group of ",
                       n, " ranks needs ", nodes, " nodes of ", c.devices_per_node,
                       " devices; give network.* or simulate at most ", c.devices_per_node,
                       " ranks");
  }
  // Across nodes a node's NICs serve the groups of its devices at once (symmetric jobs: every
  // group communicates alike), so a group with `local` of a node's devices gets that share.
  const double nics = c.nics_per_node * c.nic.bytes_per_s * local / c.devices_per_node;
  const double bus = nodes == 1 ? c.intra_node.bytes_per_s : std::min(c.intra_node.bytes_per_s, nics);
  const double alpha = nodes == 1 ? c.intra_node.latency_s : c.nic.latency_s;
  const double steps = n - 1;
  const double share = steps / n;  // (n-1)/n
  const double base = c.collective_base_latency_s;
  const auto ring = [&](double passes, double bytes) {
    return CollectiveTime{base + passes * (share * bytes / bus + steps * alpha),
                          CollectiveAlgorithm::Ring};
  };
  if (cost.op == "allreduce" || cost.op == "barrier") {
    CollectiveTime best = ring(2, size);
    if (nodes > 1) {
      const double tree = base + 2 * share * size / (0.92 * bus) +
                          2 * (std::log2(static_cast<double>(nodes)) * c.nic.latency_s +
                               (local - 1) * c.intra_node.latency_s);
      if (tree < best.seconds) best = {tree, CollectiveAlgorithm::Tree};
    }
    return best;
  }
  if (cost.op == "all_gather" || cost.op == "reduce_scatter") return ring(1, size);
  if (cost.op == "broadcast" || cost.op == "reduce") {
    return {base + size / bus + steps * alpha, CollectiveAlgorithm::Ring};
  }
  if (cost.op == "all_to_all") {
    const double intra = size * (local - 1) / n / c.intra_node.bytes_per_s;
    const double inter = nodes == 1 ? 0 : size * (n - local) / n / (nics / local);
    return {base + std::max(intra, inter) + steps * alpha, CollectiveAlgorithm::PointToPoint};
  }
  tag::kLoomSim.fail("network model: no time for operation '", cost.op, "'");
}

}  // namespace loom::sim
