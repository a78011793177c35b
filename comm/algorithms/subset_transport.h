#pragma once
// A Transport over some of another Transport's ranks: rank i of the subset is rank members[i]
// of the whole. Messages travel on the whole's ordered streams, so no new connections (the
// hierarchical backend's inter-host groups run over its flat ucx group's endpoints: one UCX
// context per group instead of two). Contract: the subset and the whole never run operations
// at the same time (the messages of both share each pair of ranks' stream), and errors name
// ranks of the whole.

#include <vector>

#include "comm/algorithms/transport.h"

namespace loom::comm::algorithms {

class SubsetTransport final : public Transport {
 public:
  // `members`: ranks of `whole`, in the subset's rank order, each at most once; whole.rank()
  // must be one of them. `whole` must outlive this.
  SubsetTransport(Transport& whole, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  void send(const void* data, size_t bytes, int dst, Deadline deadline) override;
  void recv(void* data, size_t bytes, int src, Deadline deadline) override;
  void send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                 size_t recv_bytes, int src, Deadline deadline) override;

 private:
  int whole_rank(int subset_rank) const;

  Transport& whole_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace loom::comm::algorithms
