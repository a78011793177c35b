#include "sim/rank_exchange.h"

#include <algorithm>
#include <utility>

#include "core/tags.h"

namespace loom::sim {

RankExchange::RankExchange(std::vector<int> present, std::chrono::milliseconds timeout)
    : present_(present.begin(), present.end()), timeout_(timeout) {}

int RankExchange::present_among(const std::vector<int>* members, int world_size) const {
  if (members == nullptr) {  // the world: every present rank below its size
    return static_cast<int>(std::distance(present_.begin(), present_.lower_bound(world_size)));
  }
  int count = 0;
  for (int r : *members) count += is_present(r) ? 1 : 0;
  return count;
}

template <typename Ready>
void RankExchange::wait_for(std::unique_lock<std::mutex>& lock, const std::string& what,
                            Ready ready) {
  const bool done = changed_.wait_for(lock, timeout_, [&] { return ready() || !aborted_.empty(); });
  if (!aborted_.empty()) tag::kLoomSim.fail(aborted_);
  if (!done) {
    aborted_ = "a simulated rank waited " + std::to_string(timeout_.count()) + " ms for " + what +
               ": the simulated ranks do not issue matching operations (a simulator bug: "
               "docs/simulation.md, \"Pipelines\")";
    changed_.notify_all();
    tag::kLoomSim.fail(aborted_);
  }
}

double RankExchange::meet(const std::string& key, double ready, int count) {
  std::unique_lock lock(mutex_);
  Meeting& m = meetings_[key];
  m.latest = m.came == 0 ? ready : std::max(m.latest, ready);
  ++m.came;
  if (m.came == count) changed_.notify_all();
  wait_for(lock, "the other members of " + key, [&] { return m.came >= count; });
  const double latest = m.latest;
  if (++m.left == count) meetings_.erase(key);
  return latest;
}

void RankExchange::post(const Channel& channel, Message message) {
  std::lock_guard lock(mutex_);
  channels_[channel].sent.push_back(std::move(message));
  changed_.notify_all();
}

int64_t RankExchange::take_ticket(const Channel& channel) {
  std::lock_guard lock(mutex_);
  return channels_[channel].tickets++;
}

RankExchange::Message RankExchange::message(const Channel& channel, int64_t ticket) {
  std::unique_lock lock(mutex_);
  const Messages& m = channels_[channel];
  wait_for(lock,
           "message " + std::to_string(ticket) + " from world rank " +
               std::to_string(channel.from) + " to " + std::to_string(channel.to) + " on " +
               channel.group,
           [&] { return static_cast<int64_t>(m.sent.size()) > ticket; });
  return m.sent[static_cast<size_t>(ticket)];
}

void RankExchange::abort(const std::string& why) {
  std::lock_guard lock(mutex_);
  if (aborted_.empty()) aborted_ = why;
  changed_.notify_all();
}

}  // namespace loom::sim
