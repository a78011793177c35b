#pragma once
// Where the simulated ranks of one process meet (docs/simulation.md, "Pipelines"). A pipeline's
// stages do different work, so one rank per stage is simulated, each on its own thread with its
// own timeline (sim/timeline.h); their data- and tensor-parallel peers stay implied by
// symmetry. An operation between two of these present ranks meets here:
// - a send posts its arrival time on its channel (group, sender, receiver), in send order,
//   and never blocks (an eager send); the n-th receive issued on the channel takes the n-th
//   arrival, blocking (real time) at its wait until that send has been issued;
// - a collective whose group has several present members starts at the latest of their
//   ready times: each blocks at issue until all have come (as every member of a real
//   collective must call it).
// A rank that fails aborts the exchange, which wakes the others with an error; nothing waits
// longer than the timeout, after which the error names what was waited for.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace loom::sim {

class RankExchange {
 public:
  // The world ranks simulated in this process, each on its own thread.
  explicit RankExchange(std::vector<int> present,
                        std::chrono::milliseconds timeout = std::chrono::minutes(5));

  // How many of `members` (world ranks; null: the world of `world_size`) are present.
  int present_among(const std::vector<int>* members, int world_size) const;
  bool is_present(int world_rank) const { return present_.count(world_rank) > 0; }

  // A collective's meeting: every one of `count` present members calls it with the same
  // `key` and the time its stream could start the operation; returns the latest of them.
  double meet(const std::string& key, double ready, int count);

  struct Channel {
    std::string group;
    int from = 0, to = 0;  // world ranks
    auto operator<=>(const Channel&) const = default;
  };
  // A message on `channel` that arrives at `arrival`, with the bytes of a host tensor
  // (CommCost::host_tensor; empty for a meta one).
  struct Message {
    double arrival = 0;
    std::vector<std::byte> bytes;
  };
  void post(const Channel& channel, Message message);
  // The number of the next receive issued on `channel` (0, 1, ...).
  int64_t take_ticket(const Channel& channel);
  // Message `ticket` on `channel`, once it has been sent.
  Message message(const Channel& channel, int64_t ticket);

  // Fails every wait, present and future, with `why` (a rank's error).
  void abort(const std::string& why);

 private:
  // Blocks on `lock` until `ready()`, the abort or the timeout; throws for the last two.
  template <typename Ready>
  void wait_for(std::unique_lock<std::mutex>& lock, const std::string& what, Ready ready);

  std::set<int> present_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::string aborted_;
  struct Meeting {
    int came = 0, left = 0;
    double latest = 0;
  };
  std::map<std::string, Meeting> meetings_;
  struct Messages {
    std::vector<Message> sent;
    int64_t tickets = 0;
  };
  std::map<Channel, Messages> channels_;
};

}  // namespace loom::sim
