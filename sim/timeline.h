#pragma once
// The simulated clock of one rank (docs/simulation.md, "Time"): a compute stream that runs the
// meta device's ops one after another at the device model's times, and one communication
// stream per process group that runs the sim backend's operations in issue order at the
// network model's times, each starting when it is issued (the compute stream's time then) or
// when its stream is free, whichever is later. A wait on an operation's Work (the strategies'
// own waits: DDP's buckets at the end of backward, ZeRO-3's prefetched gathers) moves the
// compute stream to the operation's completion; the time it moves is exposed communication.
// So the overlap a step gets is the one its strategy's code expresses. On a CPU cluster whose
// ranks fill the node's cores, each operation also takes its core time from the compute
// stream at its first wait (DeviceModel::communication_core_seconds): the loaded figure where
// the rank computed between the issue and the wait, the blocking one where it did not. (An
// operation never waited for takes none.) Where the cluster gives the spread of a rank's
// computation, a collective's first wait also waits for the group's stragglers (Note
// [Stragglers at a meeting] in sim/device_model.h).
//
// The ranks of a pipeline's stages are simulated together, one timeline each on its own thread,
// meeting in a RankExchange (sim/rank_exchange.h): a send to another present rank arrives at
// its start plus the network's time; the receive that takes it completes no earlier, and the
// receiver's compute stream waits for it there (its bubble); a collective among several present
// ranks starts when the last of them is ready.
//
//   sim::Timeline timeline(cluster, /*rank=*/0, world_size, DType::BF16);
//   { sim::TimelineScope scope(timeline); ...run steps on meta with sim groups... }
//   timeline.totals().now;   // seconds of simulated time

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/sim/sim_backend.h"
#include "comm/work.h"
#include "sim/cluster.h"
#include "sim/device_model.h"
#include "sim/network_model.h"
#include "sim/rank_exchange.h"
#include "strategies/trace.h"
#include "tensor/meta.h"

namespace loom::sim {

class Timeline final : public MetaCostSink, public comm::CommCostSink, public comm::WaitObserver {
 public:
  // Rank `rank` of `world_size` ranks packed onto the cluster's nodes, computing in
  // `compute_dtype` (DeviceModel). With a `trace`, every op, operation and exposed wait is
  // recorded there in simulated microseconds.
  // With an `exchange`, `rank` is one of its present ranks. Keeps its own copy of `cluster`.
  Timeline(const Cluster& cluster, int rank, int world_size, DType compute_dtype,
           strategies::Trace* trace = nullptr, RankExchange* exchange = nullptr);

  void record(const OpCost& cost) override;                        // the compute stream
  std::optional<double> simulated_now() const override { return totals().now; }
  comm::SimInterval record(const comm::CommCost& cost) override;   // the group's stream
  void issued(const comm::Work& work) override;
  void waiting(const comm::Work& work) override;

  struct Totals {
    double now = 0;           // the compute stream's time
    double compute = 0;       // its busy time (communication's core time included)
    double exposed_comm = 0;  // its time waiting for collectives
    double bubble = 0;        // its time waiting for another present rank's messages
    double comm_busy = 0;     // the communication streams' busy time, summed
    int64_t ops = 0, operations = 0;
  };
  Totals totals() const;
  const DeviceModel& device() const { return device_; }
  // Every op's cost and every operation so far (the sums by kind; the operations in order).
  // costs() is the compute stream's: read it on that thread.
  const MetaCostTotals& costs() const { return costs_; }
  std::vector<comm::CommCost> comm_log() const { return comm_log_.costs(); }

 private:
  // The start of an operation on `cost`'s group: when its stream is free and the compute
  // stream has issued it, and for a collective with several present members, when the last
  // of them is.
  double start_of(const comm::CommCost& cost, bool p2p, std::unique_lock<std::mutex>& lock);

  int rank_;
  Cluster cluster_;  // its own copy: the models below refer to it
  DeviceModel device_;
  NetworkModel network_;
  strategies::Trace* trace_;
  RankExchange* exchange_;
  strategies::CommLanes lanes_;
  mutable std::mutex mutex_;
  Totals totals_;
  MetaCostTotals costs_;
  comm::CommCostLog comm_log_;
  std::map<std::string, double, std::less<>> stream_free_at_;  // by group
  std::map<std::string, int64_t, std::less<>> collectives_;    // issued per group (meetings)
  // A receive from a present rank completes when its message arrives: the one just recorded
  // (until issued() sees its Work), then by Work until waited for.
  struct Receive {
    RankExchange::Channel channel;
    int64_t ticket = 0;
    double ready = 0;
    Tensor host_tensor;  // where its values go (CommCost::host_tensor)
  };
  std::optional<Receive> just_received_;
  std::map<const comm::Work*, Receive> receives_;
  // An operation's core time, charged at its first wait: the one just recorded (until issued()
  // sees its Work), then by Work.
  struct OnCores {
    std::string op;
    double transfer_s = 0;
    int64_t ops_at_issue = 0;  // the compute stream's ops then (Totals::ops)
    int group_size = 1;
    bool p2p = false;
  };
  void charge_cores(const OnCores& operation);  // (under mutex_)
  // A collective's wait is a meeting of its group: the last of them to arrive is later than
  // this rank by the stragglers' time (DeviceModel::straggler_seconds) of the computation since
  // the rank's last meeting (its ops' time: not communication's core time, which is the same
  // on every rank). Returns when the meeting ends, no earlier than `until`.
  double meeting_end(const OnCores& operation, double until);  // (under mutex_)
  double ops_seconds_ = 0;                  // the compute stream's ops, in all
  double ops_seconds_at_last_meeting_ = 0;
  std::optional<OnCores> just_issued_;
  std::map<const comm::Work*, OnCores> on_cores_;
};

// Installs a timeline as the calling thread's meta cost sink, comm cost sink and wait
// observer until destroyed, then restores the previous ones.
class TimelineScope {
 public:
  explicit TimelineScope(Timeline& timeline);
  ~TimelineScope();
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  MetaCostScope meta_;
  comm::CommCostSink* previous_sink_;
  comm::WaitObserver* previous_observer_;
};

}  // namespace loom::sim
