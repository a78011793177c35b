#include "comm/shm/fingerprint.h"

#include <string>

namespace loom::comm::shm {

// Note [Fingerprints]
// Ranks that disagree on a collective (one allreduces 1024 elements, the other 512; one
// broadcasts while the other reduces) would read each other's buffers with the wrong sizes
// or wait for rounds that never come. NCCL and Gloo check nothing; PyTorch checks only with
// TORCH_DISTRIBUTED_DEBUG=DETAIL, through the store. The shm backend checks always, in the
// words it already shares:
//   - every round, a rank folds its collective's fingerprint (kind, dtype, count, reduce op,
//     root) into a running chain (extend_chain), so the chain names every round so far;
//   - it publishes the chain where the peers already look for its data: beside the round in
//     its arrived line (staging rounds, one slot per staging buffer) or as the stamp of its
//     fast box (tiny rounds; the box then carries the chain instead of the round number);
//   - a rank that waited for a peer's data compares that peer's chain with its own before
//     it reads a byte, and a differing chain is a CommError naming both views;
//   - ranks that run one round on different paths (a tiny round against a staging one) never
//     see each other's signal there: a rank that waits long looks at the peer's record of
//     the round once every 64 checks, and a record of this round with another chain is the
//     same CommError (ShmBackend::fail_if_parted).
// The cost is one multiply-xorshift per round and one compare per peer of a word in a cache
// line the rank fetches anyway (docs/reliability.md has the measurement).
// A rank that waits for nobody in a round (a broadcast's root; a rank that does not want a
// reduce's result) checks nothing then, but its chain carries that round: the next round in
// which the ranks wait for each other reports it. To name both views, each rank also keeps
// its last kRecordedRounds fingerprints in its record slots, which are read only to explain
// a mismatch. The rank that finds a mismatch marks its control block, so a peer waiting for
// it fails at its next liveness check (within milliseconds) instead of at the deadline.

Fingerprint Fingerprint::unpack(uint64_t packed, uint64_t count, uint64_t seq) {
  return {.kind = static_cast<Collective>(packed & 0xff),
          .dtype = static_cast<DType>(packed >> 8 & 0xff),
          .op = static_cast<ReduceOp>(packed >> 16 & 0xff),
          .root = static_cast<int>(static_cast<uint32_t>(packed >> 32)),
          .count = count,
          .seq = seq};
}

std::string Fingerprint::str() const {
  static constexpr const char* kNames[] = {"",           "allreduce",      "reduce",
                                           "broadcast",  "all_gather",     "reduce_scatter",
                                           "all_to_all", "barrier"};
  std::string text = kNames[static_cast<int>(kind) % 8];
  if (kind != Collective::Barrier) {
    const bool reduces = kind == Collective::Allreduce || kind == Collective::Reduce ||
                         kind == Collective::ReduceScatter;
    if (reduces) text.append(" ").append(reduce_op_name(op));
    if (kind == Collective::Reduce || kind == Collective::Broadcast) {
      text.append(" root ").append(std::to_string(root));
    }
    text.append(" ").append(dtype_name(dtype)).append(" x ").append(std::to_string(count));
  }
  return text.append(" (collective #").append(std::to_string(seq)).append(")");
}

}  // namespace loom::comm::shm
