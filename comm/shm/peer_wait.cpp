#include "comm/shm/peer_wait.h"

#include <sched.h>
#include <signal.h>

#include <cerrno>
#include <fstream>
#include <thread>

#include "core/tags.h"

namespace loom::comm::shm {

bool process_alive(int64_t pid) {
  if (pid <= 0) return true;  // not attached yet: nothing to check
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  // A killed child stays a zombie until its parent reaps it.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return true;
  char state = text[close + 2];
  return state != 'Z' && state != 'X';
}

void give_up(const WaitScope& scope, const CommError& error) {
  if (scope.stop) scope.stop();
  throw error;
}

void wait_slowly(const WaitScope& scope, const std::function<bool()>& ready,
                 const std::function<int()>& lagging, Deadline deadline, const char* what) {
  using namespace std::chrono;
  auto start = Clock::now();
  auto next_check = start;
  const std::string prefix =
      tag::kCommShm.prefix() + "rank " + std::to_string(scope.rank) + ": peer ";
  while (!ready()) {
    auto now = Clock::now();
    if (now >= next_check) {
      int peer = lagging();
      const bool gave_up = peer >= 0 && scope.stopped && scope.stopped(peer);
      // A peer may post its part and exit between our look at the counters and the liveness
      // check: death only counts if, looking again after it, the peer is still behind.
      const bool died = peer >= 0 && !gave_up && !process_alive(scope.pid_of(peer)) && !ready() &&
                        lagging() == peer;
      // A peer that gave up (and may have exited since) is named for that, not as dead. It
      // raises its flag before it exits, so a peer found dead is asked again: it may have given
      // up and exited after the first look.
      if ((gave_up || (died && scope.stopped && scope.stopped(peer))) && !ready()) {
        give_up(scope, CommError(prefix + std::to_string(peer) +
                                     " gave up on the group (its own error names the cause) "
                                     "while this rank waited for it to " +
                                     what,
                                 scope.rank, peer));
      }
      if (died) {
        give_up(scope, CommError(prefix + std::to_string(peer) + " (pid " +
                                     std::to_string(scope.pid_of(peer)) +
                                     ") died while this rank waited for it to " + what,
                                 scope.rank, peer, CommFailure::PeerDied));
      }
      if (now >= deadline) {
        give_up(scope, CommError(prefix + std::to_string(peer) + " did not " + what +
                                     " before the deadline",
                                 scope.rank, peer >= 0 ? std::optional<int>(peer) : std::nullopt,
                                 CommFailure::Timeout));
      }
      next_check = now + milliseconds(5);
    }
    if (now - start < milliseconds(2)) {
      sched_yield();
    } else {
      std::this_thread::sleep_for(microseconds(50));
    }
  }
}

}  // namespace loom::comm::shm
