#include "sim/timeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>

#include "core/tags.h"

namespace loom::sim {

namespace {

int64_t microseconds(double seconds) { return std::llround(seconds * 1e6); }

double seconds_of(Clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// A received host tensor's values: the sent tensor's bytes.
void deliver(const RankExchange::Message& message, const Tensor& into) {
  if (message.bytes.size() != into.nbytes() || !into.is_contiguous()) {
    tag::kLoomSim.fail("a simulated receive into ", into.str(), " got a message of ",
                       message.bytes.size(), " bytes");
  }
  std::copy(message.bytes.begin(), message.bytes.end(), static_cast<std::byte*>(into.raw_data()));
}

}  // namespace

Timeline::Timeline(const Cluster& cluster, int rank, int world_size, DType compute_dtype,
                   strategies::Trace* trace, RankExchange* exchange)
    : rank_(rank),
      cluster_(cluster),
      device_(cluster_, std::min(world_size, cluster_.devices_per_node), compute_dtype),
      network_(cluster_, rank),
      trace_(trace),
      exchange_(exchange) {}

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
  ops_seconds_ += seconds;
  ++totals_.ops;
  costs_.record(cost);
}

double Timeline::start_of(const comm::CommCost& cost, bool p2p,
                          std::unique_lock<std::mutex>& lock) {
  const double ready = std::max(totals_.now, stream_free_at_[cost.group]);
  if (exchange_ == nullptr || p2p) return ready;
  const int present = exchange_->present_among(cost.world_ranks.get(), cost.group_size);
  if (present < 2) return ready;
  const std::string key =
      cost.group + " " + cost.op + " #" + std::to_string(collectives_[cost.group]++);
  lock.unlock();  // the others may be long in coming
  const double start = exchange_->meet(key, ready, present);
  lock.lock();
  return start;
}

comm::SimInterval Timeline::record(const comm::CommCost& cost) {
  const CollectiveTime took = network_.time(cost);
  comm::CommCost logged = cost;
  logged.host_tensor = Tensor();  // (the log keeps no tensors)
  comm_log_.record(logged);
  const bool p2p = cost.op == "send" || cost.op == "recv";
  std::unique_lock lock(mutex_);
  const double start = start_of(cost, p2p, lock);
  // Its core time is charged at its wait, which knows whether the rank computed meanwhile.
  just_issued_ = OnCores{cost.op, took.seconds, totals_.ops, cost.group_size, p2p};
  const int peer = !p2p                ? -1
                   : cost.world_ranks ? (*cost.world_ranks)[static_cast<size_t>(cost.peer)]
                                      : cost.peer;
  if (exchange_ != nullptr && p2p && exchange_->is_present(peer)) {
    if (cost.op == "recv") {  // the sender's stream carries it; done when it arrives
      const RankExchange::Channel channel{cost.group, peer, rank_};
      just_received_ = Receive{channel, exchange_->take_ticket(channel), start, cost.host_tensor};
      ++totals_.operations;
      return {start, start};
    }
    RankExchange::Message message;
    message.arrival = start + took.seconds;
    if (cost.host_tensor.defined()) {
      const Tensor packed = cost.host_tensor.contiguous();
      const auto* bytes = static_cast<const std::byte*>(packed.raw_data());
      message.bytes.assign(bytes, bytes + packed.nbytes());
    }
    exchange_->post({cost.group, rank_, peer}, std::move(message));
  }
  double& free_at = stream_free_at_[cost.group];
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

void Timeline::issued(const comm::Work& work) {
  std::lock_guard lock(mutex_);
  if (just_issued_) {
    on_cores_[&work] = *just_issued_;  // (replacing one of a Work never waited for)
    just_issued_.reset();
  }
  if (just_received_) {
    receives_[&work] = *just_received_;
    just_received_.reset();
  } else {
    receives_.erase(&work);  // (a Work at the address of one never waited for)
  }
}

void Timeline::waiting(const comm::Work& work) {
  const std::optional<Clock::time_point> done = work.completed_at();
  if (!done) return;  // (not a simulated operation: those complete at issue)
  double until = seconds_of(*done);
  bool bubble = false;
  std::unique_lock lock(mutex_);
  if (auto found = on_cores_.find(&work); found != on_cores_.end()) {
    charge_cores(found->second);
    until = meeting_end(found->second, until);
    on_cores_.erase(found);
  }
  if (auto found = receives_.find(&work); found != receives_.end()) {
    const Receive receive = found->second;
    receives_.erase(found);
    lock.unlock();  // the sender may not have sent it yet
    const RankExchange::Message message = exchange_->message(receive.channel, receive.ticket);
    if (receive.host_tensor.defined()) deliver(message, receive.host_tensor);
    until = std::max(receive.ready, message.arrival);
    lock.lock();
    bubble = true;
  }
  if (until <= totals_.now) return;
  if (trace_ != nullptr) {
    const int64_t from = microseconds(totals_.now);
    trace_->complete("wait " + work.description(), bubble ? "bubble" : "exposed communication",
                     from, microseconds(until) - from);
  }
  (bubble ? totals_.bubble : totals_.exposed_comm) += until - totals_.now;
  totals_.now = until;
}

void Timeline::charge_cores(const OnCores& operation) {
  const bool blocking = totals_.ops == operation.ops_at_issue;
  const double seconds = device_.communication_core_seconds(operation.transfer_s, blocking);
  if (seconds <= 0) return;
  if (trace_ != nullptr) {
    const int64_t from = microseconds(totals_.now);
    trace_->complete(operation.op, "communication on the cores", from,
                     microseconds(totals_.now + seconds) - from);
  }
  totals_.now += seconds;
  totals_.compute += seconds;
}

double Timeline::meeting_end(const OnCores& operation, double until) {
  if (operation.p2p || operation.group_size < 2) return until;
  const double computed = ops_seconds_ - ops_seconds_at_last_meeting_;
  ops_seconds_at_last_meeting_ = ops_seconds_;
  return std::max(until, totals_.now + device_.straggler_seconds(computed, operation.group_size));
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
