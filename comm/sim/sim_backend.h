#pragma once
// The simulated backend ("sim"): this process is one rank of a group of any size whose other
// ranks do not exist. Its tensors are on the meta device (tensor/meta.h); every operation
// moves nothing, runs on the issuing thread at issue and is reported, with its bytes and the
// group's size, to the process's CommCostSink, whose clock says when it ran (its Work's
// started_at and completed_at). Under a strategy whose ranks all do the same work (data
// parallel, ZeRO, FSDP, tensor parallelism), one process on this backend runs what every rank
// of a job of that size runs: its memory and its operations (docs/simulation.md). Groups split
// by assignment (ProcessGroup::split_by), not by color (an error naming the backend), and
// reductions read nothing: results are meta. Host (CPU) tensors are accepted too: sent and
// received between ranks simulated together, their values pass (a pipeline's headers).

#include <mutex>
#include <string>
#include <vector>

#include "comm/backend.h"

namespace loom::comm {

struct CommCost {
  std::string op;     // "allreduce", "all_gather", "reduce_scatter", "send", ...
  std::string group;  // the group's name
  int group_size = 1;
  int64_t bytes = 0;  // this rank's buffer: input of allreduce and reduce_scatter, output of
                      // all_gather and all_to_all, the tensor of the others
  int peer = -1;      // send and recv: the other rank; broadcast and reduce: the root
  // The members' ranks in the world group, in group rank order (null: the group is ranks
  // 0..group_size-1 of the world); `peer` is a group rank.
  std::shared_ptr<const std::vector<int>> world_ranks;
  // send and recv of a host (CPU) tensor: the tensor, whose values the ranks simulated
  // together in one process pass on (sim/rank_exchange.h); undefined otherwise.
  Tensor host_tensor;
};

// When a simulated operation ran: seconds of simulated time since the simulation's start.
struct SimInterval {
  double start = 0;
  double end = 0;
};

// Receives the costs of every sim group's operations, on the thread that issues them (a sim
// group runs its operations at issue: Backend::runs_at_issue), in issue order per group, and
// says when each ran (a network model's clock, sim/timeline.h; a sink without one returns an
// empty interval at 0).
class CommCostSink {
 public:
  virtual ~CommCostSink() = default;
  virtual SimInterval record(const CommCost& cost) = 0;
};

// Installs `sink` (not owned; null: none) for the sim groups' operations that the calling
// thread issues (one simulated rank per thread: a pipeline's stages, docs/simulation.md);
// returns the thread's previous one.
CommCostSink* set_comm_cost_sink(CommCostSink* sink);

// A sink that keeps every cost, in the order the operations ran.
class CommCostLog final : public CommCostSink {
 public:
  SimInterval record(const CommCost& cost) override;
  std::vector<CommCost> costs() const;

 private:
  mutable std::mutex mutex_;
  std::vector<CommCost> costs_;
};

class SimBackend final : public Backend {
 public:
  explicit SimBackend(const BackendContext& context);
  std::string name() const override { return "sim"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::meta(); }

  void allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) override;
  void broadcast(Tensor& tensor, int root, Deadline deadline) override;
  void reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) override;
  void all_gather(Tensor& output, const Tensor& input, Deadline deadline) override;
  void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op, Deadline deadline) override;
  void all_to_all(Tensor& output, const Tensor& input, Deadline deadline) override;
  void send(const Tensor& tensor, int dst, int tag, Deadline deadline) override;
  void recv(Tensor& tensor, int src, int tag, Deadline deadline) override;
  void barrier(Deadline deadline) override;

  // Splitting by color needs every rank's color, which a group of one real rank does not have.
  void check_can_split() const override;

  // Its operations complete at issue, at the times the sink's clock gives them.
  bool runs_at_issue() const override { return true; }
  Times last_times() const override { return last_times_; }

 private:
  void report(const char* op, const Tensor& tensor, int peer = -1);

  int rank_;
  int size_;
  std::string group_;
  std::shared_ptr<const std::vector<int>> world_ranks_;
  Times last_times_;  // of the last operation (they run one at a time)
};

}  // namespace loom::comm
