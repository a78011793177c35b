#include "comm/launch/rank_group.h"

#include <signal.h>

#include <algorithm>

namespace loom::comm::launch {

int RankGroup::running() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(),
                                        [](const auto& rank) { return rank->running(); }));
}

std::vector<RankGroup::Report> RankGroup::reap() {
  std::vector<Report> reports;
  for (const auto& rank : ranks_) {
    if (!rank->reap()) continue;
    const RankExit& exit = *rank->exit();
    if (exit.ok()) continue;
    if (!stopping()) {
      failed_ = true;
      exit_code_ = exit.exit_code();
      cause_was_signal_ = exit.signaled;
      reports.push_back({rank.get(), true});
      stop(SIGTERM);
      continue;
    }
    const bool sent_by_us =
        exit.signaled && (exit.value == stop_signal() || (killed_ && exit.value == SIGKILL));
    if (failed_ && exit.signaled && !sent_by_us) {
      if (!cause_was_signal_) exit_code_ = exit.exit_code();
      cause_was_signal_ = true;
      reports.push_back({rank.get(), false});
    }
  }
  return reports;
}

void RankGroup::stop(int signo) {
  stop_signal_ = signo;
  kill_at_ = Clock::now() + grace_;
  for (const auto& rank : ranks_)
    rank->signal(signo);
}

void RankGroup::kill_all() {
  killed_ = true;
  for (const auto& rank : ranks_)
    rank->signal(SIGKILL);
}

bool RankGroup::tick() {
  if (!stopping() || killed_ || !kill_at_ || Clock::now() < *kill_at_ || running() == 0) {
    return false;
  }
  kill_all();
  return true;
}

}  // namespace loom::comm::launch
