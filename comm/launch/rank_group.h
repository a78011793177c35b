#pragma once
// Ranks started together and stopped together: the one supervision rule of loomrun,
// loom-perf --np and ddp_spawn/ddp_fork. The first rank that fails (exits non-zero or is
// killed by a signal) begins the stop: every rank still running gets SIGTERM, and SIGKILL
// once `grace` has passed (tick()). A rank killed, after that, by a signal the group did not
// send is reported too: it most likely caused the first failure (a survivor can notice a
// peer's death before the launcher reaps the dead rank), so its exit becomes the job's.
// Not thread-safe: one thread drives a group (reap, tick, stop).

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "comm/launch/rank_process.h"
#include "core/deadline.h"

namespace loom::comm::launch {

class RankGroup {
 public:
  explicit RankGroup(std::chrono::milliseconds grace) : grace_(grace) {}

  void add(std::unique_ptr<RankProcess> rank) { ranks_.push_back(std::move(rank)); }
  const std::vector<std::unique_ptr<RankProcess>>& ranks() const { return ranks_; }
  int running() const;

  // What reap() found worth naming: the first failure, and later signal deaths the group did
  // not cause.
  struct Report {
    const RankProcess* rank;
    bool first_failure;
  };
  // Reaps the ranks that exited (a non-blocking waitpid on each); the first failure begins
  // the stop with SIGTERM unless a stop is under way already.
  std::vector<Report> reap();

  // Begins stopping for another reason (a signal to the launcher, a timeout): `signo` to
  // every rank still running, SIGKILL `grace` later. Exits from here on are not failures.
  void stop(int signo);
  // SIGKILL to every rank still running, now.
  void kill_all();
  // Sends the SIGKILL once the grace has passed; returns true when it did just now.
  bool tick();

  bool stopping() const { return stop_signal_.has_value(); }
  bool killed() const { return killed_; }
  std::optional<Clock::time_point> kill_at() const { return kill_at_; }
  // The signal the stop began with (SIGTERM for a failure).
  int stop_signal() const { return stop_signal_.value_or(0); }
  // The job's exit code: 0, or that of the failure the group reported (128 + signal for a
  // signal death, which wins over a plain exit).
  int exit_code() const { return exit_code_; }
  bool failed() const { return failed_; }

 private:
  std::vector<std::unique_ptr<RankProcess>> ranks_;
  std::chrono::milliseconds grace_;
  std::optional<int> stop_signal_;
  std::optional<Clock::time_point> kill_at_;
  bool killed_ = false;
  bool failed_ = false;
  bool cause_was_signal_ = false;
  int exit_code_ = 0;
};

}  // namespace loom::comm::launch
