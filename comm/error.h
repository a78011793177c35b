#pragma once
// loom::CommError: the failure of a peer or a transport (a rank that died or never arrived, a
// broken connection, a mismatched collective). The message says which rank saw it, which
// operation (with its sequence number, size and dtype) and which peer is at fault:
//   [comm/shm] rank 3: peer 5 did not arrive within 30 s (allreduce #1842, 4 MiB f32)
// After a CommError the process group is broken: destroy it and create a new one.
// It is a loom::Error, so that catching the base catches peer failures too; handlers that
// treat the two tiers differently catch CommError first.

#include <optional>
#include <stdexcept>
#include <string>

#include "core/deadline.h"  // CommErrors come from waits with deadlines
#include "core/error.h"

namespace loom {

// What went wrong, where the backend knows: handlers pick their advice from it.
enum class CommFailure {
  Unknown,
  PeerDied,  // the peer's process is gone
  Timeout,   // the peer is alive but did not take part before the deadline
  Mismatch,  // the ranks issued different collectives
};

class CommError : public Error {
 public:
  CommError(const std::string& message, int rank = -1, std::optional<int> peer = std::nullopt,
            CommFailure failure = CommFailure::Unknown)
      : Error(message), rank_(rank), peer_(peer), failure_(failure) {}
  int rank() const { return rank_; }                 // the rank that raised it (-1: none)
  std::optional<int> peer() const { return peer_; }  // the peer at fault, when known
  CommFailure failure() const { return failure_; }
  // The same error (rank, peer, failure) with a message that adds context around what().
  CommError rephrased(const std::string& message) const {
    return CommError(message, rank_, peer_, failure_);
  }

 private:
  int rank_;
  std::optional<int> peer_;
  CommFailure failure_;
};

}  // namespace loom
