#pragma once
// What a collective is, as the shm backend compares it across ranks on every round, debug
// mode or not (Note [Fingerprints] in fingerprint.cpp): its kind, dtype, element count,
// reduce op and root. Each rank folds the fingerprints of all its rounds into a running
// 64-bit chain; ranks that ran the same collectives in the same order hold the same chain.

#include <cstdint>
#include <string>

#include "comm/reduce_op.h"
#include "core/dtype.h"

namespace loom::comm::shm {

enum class Collective : uint8_t {
  Allreduce = 1,
  Reduce,
  Broadcast,
  AllGather,
  ReduceScatter,
  AllToAll,
  Barrier,
};

struct Fingerprint {
  Collective kind = Collective::Barrier;
  DType dtype = DType::U8;
  ReduceOp op = ReduceOp::Sum;  // reductions only
  int root = -1;                // reduce and broadcast only
  uint64_t count = 0;           // elements of the tensor the caller passed (per rank)
  uint64_t seq = 0;             // this backend's collective number, for messages only

  // Every field but seq in one word (with count beside it), for the records peers read.
  uint64_t packed() const;
  static Fingerprint unpack(uint64_t packed, uint64_t count, uint64_t seq);
  // "allreduce sum f32 x 1024 (collective #3)", "broadcast root 0 u8 x 0 (collective #4)".
  std::string str() const;
};

inline constexpr uint64_t kChainStart = 0x6c6f6f6d2d73686dULL;  // "loom-shm"

inline uint64_t Fingerprint::packed() const {
  return static_cast<uint64_t>(kind) | static_cast<uint64_t>(dtype) << 8 |
         static_cast<uint64_t>(op) << 16 | static_cast<uint64_t>(static_cast<uint32_t>(root))
                                               << 32;
}

// The chain after one more round of `print`. Never 0, so a zeroed box or line never matches.
// Inline: it runs on every round of every collective.
inline uint64_t extend_chain(uint64_t chain, const Fingerprint& print) {
  // splitmix64's finaliser over the chain and both words: a change in any field changes
  // every later chain value (up to 64-bit collisions).
  auto mix = [](uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  uint64_t next = mix(chain ^ mix(print.packed() ^ mix(print.count + 0x9e3779b97f4a7c15ULL)));
  return next == 0 ? 1 : next;
}

}  // namespace loom::comm::shm
