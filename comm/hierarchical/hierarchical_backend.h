#pragma once
// The hierarchical backend: a group whose ranks sit on several hosts, as an intra-host group
// per host (shm) and an inter-host group per local rank over a network backend (tcp, or ucx
// where an RDMA device exists: Note [The network between hosts]) (Note [Hierarchical
// collectives] in hierarchical_backend.cpp). allreduce = intra-host reduce-scatter,
// inter-host allreduce of each shard, intra-host all-gather; reduce-scatter and all-gather
// likewise; broadcast, reduce, all-to-all, point-to-point and barrier go over a flat network
// backend of the whole group. The backend 'auto' picks it for CPU groups that span hosts.
//
// A host is what the ranks' host keys say: LOOM_HOST_ID when set, else the host name and
// network namespace (so that the test hosts of scripts/netns_hosts.sh count as hosts). With
// one host, or hosts of different rank counts, or ranks not numbered host by host, every
// collective takes the flat network path (two_levels() says which).
//
// Results are bitwise the same from run to run and on every rank. They equal the flat
// path's bits for Min, Max and integer Sum and Prod (exact), and whenever there is one rank
// per host; a floating-point Sum over several ranks per host adds the hosts' partial sums
// (((r0 + r1) + (r2 + r3)) instead of (((r0 + r1) + r2) + r3)), and Avg scales that sum once
// at the end, so those can differ from the flat path in the last bits. bf16 and f16 are
// rounded once per level.

#include <memory>
#include <string>

#include "comm/algorithms/subset_transport.h"
#include "comm/backend.h"

namespace loom::comm::hierarchical {

class HierarchicalBackend final : public Backend {
 public:
  // Collective over the group: exchanges host keys through the store, then creates the
  // intra-host, inter-host and flat backends.
  explicit HierarchicalBackend(const BackendContext& context);
  ~HierarchicalBackend() override;

  std::string name() const override { return "hierarchical"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) override;
  void broadcast(Tensor& tensor, int root, Deadline deadline) override;
  void reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) override;
  void all_gather(Tensor& output, const Tensor& input, Deadline deadline) override;
  void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op, Deadline deadline) override;
  void all_to_all(Tensor& output, const Tensor& input, Deadline deadline) override;
  void send(const Tensor& tensor, int dst, int tag, Deadline deadline) override;
  void recv(Tensor& tensor, int src, int tag, Deadline deadline) override;
  void barrier(Deadline deadline) override;

  // The layout found: hosts, ranks per host, and whether collectives take the two levels.
  int hosts() const { return hosts_; }
  int local_size() const { return local_size_; }
  bool two_levels() const { return intra_ != nullptr; }

 private:
  int rank_, size_;
  int hosts_ = 1, local_size_ = 1;
  std::unique_ptr<Backend> intra_;  // this host's ranks (shm); null: flat only
  std::unique_ptr<Backend> flat_;   // the whole group (tcp or ucx; shm on one host)
  // The ranks of this local rank on every host, over flat_'s endpoints; null: flat only.
  std::unique_ptr<algorithms::SubsetTransport> inter_;
};

}  // namespace loom::comm::hierarchical
