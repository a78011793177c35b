#include "comm/shm/peer_wait.h"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
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

namespace {

// How long a wait yields its core between checks before it sleeps: a wait this short is
// answered faster by a check after each yield than by a wake-up, a longer one costs a core that
// the ranks' compute threads need. 2 ms before the doorbells (when sleeping meant naps); 100 us
// with them took the 3-D job of 8 ranks on 2 cores 0.92-0.95x the time, and the pipelines and
// ZeRO-3 the same (2026-12-05, docs/performance_comm.md, "Waiting long: doorbells").
constexpr auto kYieldBeforeSleeping = std::chrono::microseconds(100);
// Without a doorbell (a scope made outside a segment), the nap between checks.
constexpr auto kNap = std::chrono::microseconds(50);

// FUTEX_WAIT without FUTEX_PRIVATE_FLAG: the word is in a segment other processes map.
void futex_wait(std::atomic<uint32_t>& word, uint32_t seen, Clock::duration at_most) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(at_most).count();
  if (ns <= 0) return;
  timespec timeout{.tv_sec = static_cast<time_t>(ns / 1'000'000'000),
                   .tv_nsec = static_cast<long>(ns % 1'000'000'000)};
  // EAGAIN (rung meanwhile), EINTR and ETIMEDOUT all mean: look again.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &timeout, nullptr, 0);
}

// Orders this thread's stores before it and every registered process's running threads'
// loads after it, and their stores before it and this thread's loads after it (false where the
// kernel refuses: the caller must not sleep then). An unregistered publisher fences itself.
bool barrier_with_publishers() {
  return syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0;
}

// Sleeps until a peer rings this rank's doorbell or `until`, unless ready() turns true first
// (Note [Doorbells]). Where the barrier is refused, naps instead.
void sleep_until_rung(const WaitScope& scope, const std::function<bool()>& ready,
                      Clock::time_point until) {
  // Counted as asleep until this returns or ready() throws (a peer running another collective).
  struct Asleep {
    Doorbell& bell;
    SegmentControl& segment;
    Asleep(Doorbell& b, SegmentControl& s) : bell(b), segment(s) {
      bell.sleeping.fetch_add(1, std::memory_order_seq_cst);
      segment.sleepers.fetch_add(1, std::memory_order_seq_cst);
    }
    ~Asleep() {
      segment.sleepers.fetch_sub(1, std::memory_order_release);
      bell.sleeping.fetch_sub(1, std::memory_order_release);
    }
    Asleep(const Asleep&) = delete;
    Asleep& operator=(const Asleep&) = delete;
  } asleep(*scope.doorbell, *scope.segment);
  if (barrier_with_publishers()) {
    const uint32_t seen = asleep.bell.rings.load(std::memory_order_acquire);
    if (!ready()) futex_wait(asleep.bell.rings, seen, until - Clock::now());
  } else {
    std::this_thread::sleep_for(kNap);
  }
}

}  // namespace

bool publish_without_fence() {
  static const bool registered =
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0;
  return registered;
}

void ring_doorbell(Doorbell& bell) {
  bell.rings.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell.rings), FUTEX_WAKE, INT32_MAX, nullptr,
          nullptr, 0);
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
    if (now - start < kYieldBeforeSleeping) {
      sched_yield();
    } else if (scope.doorbell != nullptr) {
      sleep_until_rung(scope, ready, std::min(next_check, deadline));
    } else {
      std::this_thread::sleep_for(kNap);
    }
  }
}

}  // namespace loom::comm::shm
