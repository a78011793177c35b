#pragma once
// The simulated clock of one rank (docs/simulation.md, "Time"): a compute stream that runs the
// meta device's ops one after another at the device model's times, and one communication
// stream per process group that runs the sim backend's operations in issue order at the
// network model's times, each starting when it is issued (the compute stream's time then) or
// when its stream is free, whichever is later. A wait on an operation's Work (the strategies'
// own waits: DDP's buckets at the end of backward, ZeRO-3's prefetched gathers) moves the
// compute stream to the operation's completion; the time it moves is exposed communication.
// So the overlap a step gets is the one its strategy's code expresses.
//
//   sim::Timeline timeline(cluster, /*rank=*/0, world_size, DType::BF16);
//   { sim::TimelineScope scope(timeline); ...run steps on meta with sim groups... }
//   timeline.totals().now;   // seconds of simulated time

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "comm/sim/sim_backend.h"
#include "comm/work.h"
#include "sim/cluster.h"
#include "sim/device_model.h"
#include "sim/network_model.h"
#include "strategies/trace.h"
#include "tensor/meta.h"

namespace loom::sim {

class Timeline final : public MetaCostSink, public comm::CommCostSink, public comm::WaitObserver {
 public:
  // Rank `rank` of `world_size` ranks packed onto the cluster's nodes, computing in
  // `compute_dtype` (DeviceModel). With a `trace`, every op, operation and exposed wait is
  // recorded there in simulated microseconds.
  Timeline(const Cluster& cluster, int rank, int world_size, DType compute_dtype,
           strategies::Trace* trace = nullptr);

  void record(const OpCost& cost) override;                        // the compute stream
  comm::SimInterval record(const comm::CommCost& cost) override;   // the group's stream
  void waiting(const comm::Work& work) override;

  struct Totals {
    double now = 0;           // the compute stream's time
    double compute = 0;       // its busy time
    double exposed_comm = 0;  // its time waiting for communication
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
  DeviceModel device_;
  NetworkModel network_;
  strategies::Trace* trace_;
  strategies::CommLanes lanes_;
  mutable std::mutex mutex_;
  Totals totals_;
  MetaCostTotals costs_;
  comm::CommCostLog comm_log_;
  std::map<std::string, double, std::less<>> stream_free_at_;  // by group
};

// Installs a timeline as the calling thread's meta cost sink, the process's comm cost sink
// and its wait observer until destroyed, then restores the previous ones.
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
