#pragma once
// loom::CommError: the failure of a peer or a transport (a rank that died or never arrived, a
// broken connection, a mismatched collective). The message says which rank saw it, which
// operation (with its sequence number, size and dtype) and which peer is at fault:
//   [comm/shm] rank 3: peer 5 did not arrive within 30 s (allreduce #1842, 4 MiB f32)
// After a CommError the process group is broken: destroy it and create a new one.
// It is a loom::Error, so that catching the base catches peer failures too; handlers that
// treat the two tiers differently catch CommError first.

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>

#include "tensor/error.h"

namespace loom {

class CommError : public Error {
 public:
  CommError(const std::string& message, int rank = -1, std::optional<int> peer = std::nullopt)
      : Error(message), rank_(rank), peer_(peer) {}
  int rank() const { return rank_; }                 // the rank that raised it (-1: none)
  std::optional<int> peer() const { return peer_; }  // the peer at fault, when known

 private:
  int rank_;
  std::optional<int> peer_;
};

namespace comm {

using Clock = std::chrono::steady_clock;
using Duration = std::chrono::milliseconds;
using Deadline = Clock::time_point;

// Default for every wait in the layer (stores, collectives, rendezvous).
inline constexpr Duration kDefaultTimeout = std::chrono::minutes(5);

inline Deadline deadline_after(Duration timeout) {
  return Clock::now() + timeout;
}
// "30 s", "250 ms", "5 min" for messages.
std::string duration_str(Duration d);

}  // namespace comm
}  // namespace loom
