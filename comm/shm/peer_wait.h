#pragma once
// Waiting on other ranks through shared memory: spin briefly (latency), then yield (ranks may
// outnumber cores), then sleep on this rank's doorbell until a peer publishes something (Note
// [Doorbells] in comm/shm/layout.h). Every few milliseconds the ranks still awaited are
// checked for liveness, so a dead peer, or one that gave up on the group with an
// error of its own, is reported at once instead of at the deadline.

#include <cstdint>
#include <functional>
#include <string>

#include "comm/cpu_relax.h"
#include "comm/error.h"
#include "comm/shm/layout.h"

namespace loom::comm::shm {

// True while the process exists and is not a zombie.
bool process_alive(int64_t pid);

struct WaitScope {
  int rank;                            // this rank, for messages
  std::function<int64_t(int)> pid_of;  // pid of a peer (0: not attached yet)
  std::function<bool(int)> stopped;    // whether a peer gave up on the group
  std::function<void()> stop;          // tells the peers that this rank gives up
  // Where this rank sleeps while it waits long (Note [Doorbells]); without them, short naps.
  Doorbell* doorbell = nullptr;
  SegmentControl* segment = nullptr;
};

// Wakes whoever sleeps on `bell` (Note [Doorbells]).
void ring_doorbell(Doorbell& bell);

// Registers this process for the waiters' barrier (membarrier's global expedited command),
// once per process; true when it did, and its publishers may then skip their fence (Note
// [Doorbells]).
bool publish_without_fence();

// The publisher's side of Note [Doorbells], after a store that a peer may wait for: whether
// any rank of the segment sleeps (then ring the sleeping peers' doorbells). One load of a line
// nobody writes while nobody sleeps, after a fence only where this process could not register
// for the waiters' barrier (`fenced`).
inline bool anyone_asleep(const SegmentControl& segment, bool fenced) {
  if (fenced) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the compiler's order only
  }
  return segment.sleepers.load(std::memory_order_acquire) != 0;
}

// Marks this rank as stopped (scope.stop) and throws `error`.
[[noreturn]] void give_up(const WaitScope& scope, const CommError& error);

// The part of wait_until after the initial spin: yields, sleeps and liveness checks.
void wait_slowly(const WaitScope& scope, const std::function<bool()>& ready,
                 const std::function<int()>& lagging, Deadline deadline, const char* what);

// Returns once ready() is true. lagging() names a peer that is still awaited (or -1).
// Throws loom::CommError naming that peer when it died, gave up or when `deadline` passes.
// For kSpinBeforeYielding the checks spin inline (no allocation, no call through a pointer, a clock
// read per 64 checks), which is what a small collective between ranks on their own cores
// costs; then wait_slowly yields and sleeps.
template <typename Ready, typename Lagging>
void wait_until(const WaitScope& scope, Ready&& ready, Lagging&& lagging, Deadline deadline,
                const char* what) {
  for (int i = 0; i < 256; ++i) {  // most waits end here, before a clock read
    if (ready()) return;
    cpu_relax();
  }
  const Clock::time_point spin_until = Clock::now() + kSpinBeforeYielding;
  do {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return;
      cpu_relax();
    }
  } while (Clock::now() < spin_until);
  wait_slowly(scope, ready, lagging, deadline, what);
}

}  // namespace loom::comm::shm
