#pragma once
// Waiting on other ranks through shared memory: spin briefly (latency), then yield, then
// sleep in short naps (ranks may outnumber cores). Every few milliseconds the ranks still
// awaited are checked for liveness, so a dead peer, or one that gave up on the group with an
// error of its own, is reported at once instead of at the deadline.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "comm/cpu_relax.h"
#include "comm/error.h"

namespace loom::comm::shm {

// True while the process exists and is not a zombie.
bool process_alive(int64_t pid);

struct WaitScope {
  int rank;                            // this rank, for messages
  std::function<int64_t(int)> pid_of;  // pid of a peer (0: not attached yet)
  std::function<bool(int)> stopped;    // whether a peer gave up on the group
  std::function<void()> stop;          // tells the peers that this rank gives up
};

// Marks this rank as stopped (scope.stop) and throws `error`.
[[noreturn]] void give_up(const WaitScope& scope, const CommError& error);

// The part of wait_until after the initial spin: yields, naps and liveness checks.
void wait_slowly(const WaitScope& scope, const std::function<bool()>& ready,
                 const std::function<int()>& lagging, Deadline deadline, const char* what);

// How long wait_until spins inline before it starts yielding the core. A small collective
// between ranks on cores of their own waits well under a microsecond; where ranks outnumber
// cores, the peer awaited may need this core, and every microsecond spun is one it does not
// get. Timed, not counted: a pause lasts 24 ns on this machine's Zen 4 (4000 of them, the
// count until 2026-11-29, spun 95 us) and a few on other cores (docs/performance_comm.md,
// "2026-11-29: spinning by time").
inline constexpr auto kSpinInline = std::chrono::microseconds(20);

// Returns once ready() is true. lagging() names a peer that is still awaited (or -1).
// Throws loom::CommError naming that peer when it died, gave up or when `deadline` passes.
// For kSpinInline the checks spin inline (no allocation, no call through a pointer, a clock
// read per 64 checks), which is what a small collective between ranks on their own cores
// costs; then wait_slowly yields and naps.
template <typename Ready, typename Lagging>
void wait_until(const WaitScope& scope, Ready&& ready, Lagging&& lagging, Deadline deadline,
                const char* what) {
  for (int i = 0; i < 256; ++i) {  // most waits end here, before a clock read
    if (ready()) return;
    cpu_relax();
  }
  const Clock::time_point spin_until = Clock::now() + kSpinInline;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return;
      cpu_relax();
    }
  } while (Clock::now() < spin_until);
  wait_slowly(scope, ready, lagging, deadline, what);
}

}  // namespace loom::comm::shm
