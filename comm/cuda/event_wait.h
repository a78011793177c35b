#pragma once
// Waiting for device work from a comm thread without blocking past a deadline: CUDA offers no
// "synchronize with a timeout", so the event is polled.

#include <chrono>
#include <thread>

#include "comm/error.h"

namespace loom::comm {

// Polls `event` (a cuda::Event, or anything whose query() says whether its work finished)
// until its work finished (returns true) or `deadline` passed (false). Spins
// with yields first (collectives of small tensors finish within microseconds), then sleeps
// 50 us between polls so that a long wait does not burn a core. Calls `check()` every 64
// polls, which may throw to end the wait early (the nccl backend checks for asynchronous
// errors there).
template <typename Event, typename Check>
bool wait_event(const Event& event, Deadline deadline, Check&& check) {
  for (unsigned polls = 0;; ++polls) {
    if (event.query()) return true;
    if (polls % 64 == 63) check();
    if (Clock::now() >= deadline) return event.query();
    if (polls < 2048) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

template <typename Event>
bool wait_event(const Event& event, Deadline deadline) {
  return wait_event(event, deadline, [] {});
}

}  // namespace loom::comm
