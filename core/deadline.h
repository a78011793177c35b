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

// "30 s", "250 ms", "5 min" for messages.
std::string duration_str(Duration d);

}  // namespace loom
