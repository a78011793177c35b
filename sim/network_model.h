#pragma once
// The network model: how long one operation of the sim backend (comm/sim/sim_backend.h)
// takes on a cluster, with the algorithms NCCL uses (Note [Collective times]).

#include <string>

#include "comm/sim/sim_backend.h"
#include "sim/cluster.h"

namespace loom::sim {

// Which algorithm a collective's time is NCCL's for.
enum class CollectiveAlgorithm { None, Ring, Tree, PointToPoint };
const char* algorithm_name(CollectiveAlgorithm algorithm);

struct CollectiveTime {
  double seconds = 0;
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::None;
};

class NetworkModel {
 public:
  // `rank`: the simulated rank, placed on node rank / devices_per_node. A group of n ranks is
  // taken to be n consecutive ranks from a node's start (data-parallel groups of a packed job).
  NetworkModel(const Cluster& cluster, int rank);  // refers to `cluster`: it must outlive it
  // Throws loom::Error when the group needs more than one node and the cluster has no network.
  CollectiveTime time(const comm::CommCost& cost) const;

 private:
  const Cluster& cluster_;
  int rank_;
};

}  // namespace loom::sim
