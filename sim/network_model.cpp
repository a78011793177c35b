#include "sim/network_model.h"

#include <algorithm>
#include <cmath>

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
// A group of n ranks spans `nodes` nodes with `local` ranks on each (packed). Its bus
// bandwidth B is the node's (NVLink) within one node; across nodes NCCL runs one ring (or
// tree) per NIC, so a node's NICs carry the traffic together and B = min(node bus bandwidth,
// NICs x NIC bandwidth). With S the operation's whole buffer (allreduce: its input;
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
CollectiveTime NetworkModel::time(const comm::CommCost& cost) const {
  const int n = cost.group_size;
  const double size = static_cast<double>(cost.bytes);
  const Cluster& c = cluster_;
  if (cost.op == "send" || cost.op == "recv") {
    const bool same_node = cost.peer / c.devices_per_node == rank_ / c.devices_per_node;
    if (!same_node && c.nics_per_node == 0) {
      tag::kLoomSim.fail("cluster ", c.name, " has no network (network.nics_per_node 0), but rank ",
                         rank_, " sends to rank ", cost.peer, " on another node");
    }
    const double rank_nics = std::max(1.0, static_cast<double>(c.nics_per_node) / c.devices_per_node);
    const LinkSpec link = same_node ? c.intra_node
                                    : LinkSpec{.bytes_per_s = c.nic.bytes_per_s * std::min(1.0, rank_nics),
                                               .latency_s = c.nic.latency_s};
    return {size / link.bytes_per_s + link.latency_s, CollectiveAlgorithm::PointToPoint};
  }
  if (n <= 1) return {};
  const int local = std::min(n, c.devices_per_node);
  const int nodes = (n + c.devices_per_node - 1) / c.devices_per_node;
  if (nodes > 1 && c.nics_per_node == 0) {
    tag::kLoomSim.fail("cluster ", c.name, " has no network (network.nics_per_node 0): a group of ",
                       n, " ranks needs ", nodes, " nodes of ", c.devices_per_node,
                       " devices; give network.* or simulate at most ", c.devices_per_node,
                       " ranks");
  }
  const double bus = nodes == 1 ? c.intra_node.bytes_per_s
                                : std::min(c.intra_node.bytes_per_s, c.nics_per_node * c.nic.bytes_per_s);
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
    const double inter =
        nodes == 1 ? 0
                   : size * (n - local) / n /
                         (c.nics_per_node * c.nic.bytes_per_s / c.devices_per_node);
    return {base + std::max(intra, inter) + steps * alpha, CollectiveAlgorithm::PointToPoint};
  }
  tag::kLoomSim.fail("network model: no time for operation '", cost.op, "'");
}

}  // namespace loom::sim
