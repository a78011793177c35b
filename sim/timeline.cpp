#include "sim/timeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace loom::sim {

namespace {

int64_t microseconds(double seconds) { return std::llround(seconds * 1e6); }

double seconds_of(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

}  // namespace

Timeline::Timeline(const Cluster& cluster, int rank, int world_size, DType compute_dtype,
                   strategies::Trace* trace)
    : device_(cluster, std::min(world_size, cluster.devices_per_node), compute_dtype),
      network_(cluster, rank),
      trace_(trace) {}

void Timeline::record(const OpCost& cost) {
  const double seconds = device_.seconds(cost);
  std::lock_guard lock(mutex_);
  if (trace_ != nullptr) {
    const int64_t start = microseconds(totals_.now);
    trace_->complete(cost.op, op_class_name(cost.op_class), start,
                     microseconds(totals_.now + seconds) - start);
  }
  totals_.now += seconds;
  totals_.compute += seconds;
  ++totals_.ops;
  costs_.record(cost);
}

comm::SimInterval Timeline::record(const comm::CommCost& cost) {
  const CollectiveTime took = network_.time(cost);
  comm_log_.record(cost);
  std::lock_guard lock(mutex_);
  double& free_at = stream_free_at_[cost.group];
  const double start = std::max(totals_.now, free_at);
  free_at = start + took.seconds;
  totals_.comm_busy += took.seconds;
  ++totals_.operations;
  if (trace_ != nullptr) {
    const int64_t from = microseconds(start), to = microseconds(free_at);
    trace_->complete(cost.op, algorithm_name(took.algorithm), from, to - from,
                     lanes_.row_for(*trace_, from, to),
                     {{"bytes", cost.bytes}, {"group_size", cost.group_size}});
  }
  return {start, free_at};
}

void Timeline::waiting(const comm::Work& work) {
  const std::optional<Clock::time_point> done = work.completed_at();
  if (!done) return;  // (not a simulated operation: those complete at issue)
  const double until = seconds_of(*done);
  std::lock_guard lock(mutex_);
  if (until <= totals_.now) return;
  if (trace_ != nullptr) {
    const int64_t from = microseconds(totals_.now);
    trace_->complete("wait " + work.description(), "exposed communication", from,
                     microseconds(until) - from);
  }
  totals_.exposed_comm += until - totals_.now;
  totals_.now = until;
}

Timeline::Totals Timeline::totals() const {
  std::lock_guard lock(mutex_);
  return totals_;
}

TimelineScope::TimelineScope(Timeline& timeline)
    : meta_(timeline),
      previous_sink_(comm::set_comm_cost_sink(&timeline)),
      previous_observer_(comm::set_wait_observer(&timeline)) {}

TimelineScope::~TimelineScope() {
  comm::set_wait_observer(previous_observer_);
  comm::set_comm_cost_sink(previous_sink_);
}

}  // namespace loom::sim
