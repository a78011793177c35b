#pragma once
// Clocks and deadlines for every wait in Loom: nothing waits forever, so each blocking call
// takes a Deadline (or a Duration it turns into one) and fails, saying how long it waited,
// once the deadline passes.

#include <chrono>
#include <string>

namespace loom {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;
using Deadline = Clock::time_point;

// Default for every wait of the communication layer (stores, collectives, rendezvous).
inline constexpr Duration kDefaultTimeout = std::chrono::minutes(5);

inline Deadline deadline_after(Duration timeout) {
  return Clock::now() + timeout;
}

// The monotonic clock as of the kernel's last timer tick (CLOCK_MONOTONIC_COARSE): the time
// line of Clock (libstdc++'s steady_clock reads CLOCK_MONOTONIC), at most coarse_clock_lag()
// behind Clock::now(), and read in about 3 ns where Clock::now() takes about 20. For times
// taken on every small operation, where that difference is a tenth of the call (Note
// [Operation times] in comm/process_group.cpp). Clock::now() where there is no such clock.
Clock::time_point coarse_now();
// How far coarse_now() may lag: twice the clock's resolution (its resolution is one timer
// tick, 1 to 4 ms, and a tick can itself come late: 4.5 ms was seen with 4 ms ticks under
// ThreadSanitizer); zero where coarse_now() is Clock::now().
Clock::duration coarse_clock_lag();

// "30 s", "250 ms", "5 min" for messages.
std::string duration_str(Duration d);

}  // namespace loom
