#pragma once
// Layout of the shm backend's segment. Control words sit on their own cache lines; each
// counter is written by one rank only (the owner) and read by the others.
//
//   [SegmentControl] [RankControl x size] [ChannelControl x size*size]
//   [FastBox x size*kFastBoxSlots]
//   [RoundRecord x size*kRecordedRounds]
//   [staging: size ranks x 2 buffers x stage_bytes] [results: size x 2 x slice_bytes]
//   [channel rings: size*size x channel_bytes]
//
// See Note [Rounds] in shm_backend.cpp for how the counters are used, and Note
// [Fingerprints] in fingerprint.cpp for the chains and records.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace loom::comm::shm {

struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
};
static_assert(sizeof(Counter) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Note [Doorbells]
// A rank that has waited kSpinBeforeYielding and then yielded for a while sleeps in the kernel
// (a futex on its doorbell) instead of napping: naps of 50 us woke each waiting thread 20,000
// times a second, and on a machine whose cores all compute (2 ranks on 2 cores, each with a
// waiting progress thread) every wake-up preempted a rank's compute thread. A 2-stage pipeline
// of the small GPT took 70-75 ms a step with naps and 61 with a doorbell (2026-12-05,
// docs/performance_comm.md, "Waiting long: doorbells"); longer naps would have delayed every
// long wait.
// A waiter raises its doorbell's `sleeping`, counts itself in SegmentControl::sleepers, reads
// `rings`, checks once more and sleeps while `rings` is unchanged. A rank that publishes
// anything a peer may wait for (a counter, a stamp, a channel's head or tail) then looks at
// `sleepers` and, only where there are some, bumps each sleeping peer's `rings` and wakes it.
// Either the waiter's last check sees the publication or the publisher sees the sleeper, if
// neither side's load passes its own store: a Dekker pattern. The publisher's side is the hot
// one (every small allreduce), and a fence there waits for the store to leave the core, which
// the fast boxes take care never to wait for (Note [Claiming the next box] in
// shm_backend.cpp); so the waiter pays for both: it calls membarrier's global expedited
// command, which runs a full barrier on every thread of the processes registered for it, and
// a registered process publishes with no fence at all (the asymmetric barrier of liburcu and
// folly). A process the kernel does not register fences as it publishes; a waiter whose
// membarrier call fails naps. Sleeps are bounded (the liveness checks' period), so a peer that
// died without ringing is still found.
struct alignas(64) Doorbell {
  std::atomic<uint32_t> rings{0};     // the futex word: bumped by a peer that woke this rank
  std::atomic<uint32_t> sleeping{0};  // this rank's threads asleep on `rings` or about to be
};
static_assert(sizeof(Doorbell) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct alignas(64) SegmentControl {
  std::atomic<uint32_t> sleepers{0};  // the sum of the ranks' Doorbell::sleeping
};

// The arrived counter with the rank's fingerprint chain of its staging rounds beside it (slot
// round % 2, like the staging buffers), so a peer that sees the round has the chain too.
struct alignas(64) ArrivedLine {
  std::atomic<uint64_t> value{0};  // last round whose data this rank posted
  std::atomic<uint64_t> chain[2] = {0, 0};
};
static_assert(sizeof(ArrivedLine) == 64);

struct RankControl {
  Counter pid;          // process id, written once when the rank attaches
  ArrivedLine arrived;  // last round whose data this rank posted, and its chain
  Counter reduced;      // last round whose reduced slice this rank wrote
  Counter consumed;     // last round this rank finished reading
  Counter stopped;      // 1 once this rank gave up on the group with a CommError
  Doorbell doorbell;    // Note [Doorbells]
};

// A small message (up to 4 KiB and a little more) followed by the fingerprint chain of the
// round it belongs to (its stamp), so a reader that sees its own chain there also has the data.
// The data starts on a cache line, and the stamp at the next multiple of 8 bytes after it: up
// to 56 bytes, data and stamp share one line. Writer and readers find the stamp by the size,
// which every rank passes alike; a rank that passed another size waits at another place and
// finds the mismatch in the peer's round record (Note [Fast boxes] in shm_backend.cpp).
// Boxes start on 128 bytes, as the cores fetch lines in aligned pairs (the adjacent-line
// prefetcher): with 65-line boxes every other box split its first two lines across two pairs,
// and 128 and 256-byte allreduces took 1.06x the time of 128-byte aligned boxes in the slow
// mode and 128 bytes 1.06x in the fast one (2026-11-28, docs/performance_comm.md).
// Messages of 57 to kLinedBytes bytes travel lined instead: each line holds 56 bytes of data
// and a copy of the stamp in its last 8, so a reader waits for all its lines at once rather
// than for the stamp's line and then the data's (Note [Lined boxes] in shm_backend.cpp).
struct alignas(128) FastBox {
  unsigned char data[4096 + 128];

  static constexpr size_t kLineBytes = 64;
  static constexpr size_t kLineData = 56;     // data bytes per line of a lined message
  static constexpr size_t kLinedBytes = 512;  // the largest lined message
  static constexpr bool lined(size_t bytes) { return bytes > kLineData && bytes <= kLinedBytes; }
  static constexpr size_t lines(size_t bytes) { return (bytes + kLineData - 1) / kLineData; }
  unsigned char* line(size_t i) { return data + i * kLineBytes; }
  const unsigned char* line(size_t i) const { return data + i * kLineBytes; }

  static constexpr size_t stamp_offset(size_t bytes) { return (bytes + 7) / 8 * 8; }
  // The part of the box a message of `bytes` bytes and its stamp occupy: [0, used_bytes).
  static constexpr size_t used_bytes(size_t bytes) {
    return lined(bytes) ? lines(bytes) * kLineBytes : stamp_offset(bytes) + sizeof(uint64_t);
  }
  // The stamp of a message that is not lined.
  std::atomic_ref<uint64_t> stamp(size_t bytes) { return word_at(stamp_offset(bytes)); }
  // The stamp in line `line` of a lined message.
  std::atomic_ref<uint64_t> line_stamp(size_t i) { return word_at(i * kLineBytes + kLineData); }
  // Whether the box holds a message of `bytes` bytes stamped `chain`: for a lined message,
  // every line's stamp, each loaded rather than stopping at the first (they travel at once).
  bool stamped(size_t bytes, uint64_t chain) {
    if (!lined(bytes)) return stamp(bytes).load(std::memory_order_acquire) == chain;
    bool all = true;
    for (size_t i = 0; i < lines(bytes); ++i)
      all &= line_stamp(i).load(std::memory_order_acquire) == chain;
    return all;
  }

 private:
  std::atomic_ref<uint64_t> word_at(size_t offset) {
    return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(data + offset));
  }
};
static_assert(sizeof(FastBox) == 4096 + 128);
// (The last 64 bytes are padding to the next box's 128-byte boundary.)
inline constexpr size_t kFastBoxBytes = 4096 + 64 - sizeof(uint64_t);
static_assert(FastBox::used_bytes(kFastBoxBytes) <= sizeof(FastBox::data));
static_assert(FastBox::used_bytes(FastBox::kLinedBytes) <= sizeof(FastBox::data));
static_assert(std::atomic_ref<uint64_t>::required_alignment <= sizeof(uint64_t));
// Per rank, used round-robin; more than twice the posts a rank may have outstanding (Note [Box
// slots] in shm_backend.cpp).
inline constexpr uint64_t kFastBoxSlots = 32;

// What a rank ran in one round, kept for kRecordedRounds rounds to explain a mismatch.
struct alignas(64) RoundRecord {
  std::atomic<uint64_t> round{0}, chain{0}, packed{0}, count{0}, seq{0};
};
inline constexpr uint64_t kRecordedRounds = kFastBoxSlots;

// Byte stream from rank `src` to rank `dst`: head counts bytes written (by src), tail bytes
// read (by dst); both only grow.
struct ChannelControl {
  Counter head;
  Counter tail;
};

struct Layout {
  int size = 1;
  size_t slice_bytes = 0;    // per-rank share of one round of a reduction
  size_t stage_bytes = 0;    // one rank's staging buffer: size * slice_bytes
  size_t channel_bytes = 0;  // ring capacity of one point-to-point channel
  size_t segment_offset = 0, ranks_offset = 0, channels_offset = 0, fastbox_offset = 0,
         records_offset = 0, staging_offset = 0, results_offset = 0, rings_offset = 0,
         total_bytes = 0;

  static Layout make(int size, size_t slice_bytes, size_t channel_bytes) {
    Layout l;
    l.size = size;
    l.slice_bytes = slice_bytes;
    l.stage_bytes = slice_bytes * static_cast<size_t>(size);
    l.channel_bytes = channel_bytes;
    size_t n = static_cast<size_t>(size);
    l.segment_offset = 0;
    l.ranks_offset = sizeof(SegmentControl);
    l.channels_offset = l.ranks_offset + n * sizeof(RankControl);
    l.fastbox_offset = (l.channels_offset + n * n * sizeof(ChannelControl) + 127) / 128 * 128;
    l.records_offset = l.fastbox_offset + n * kFastBoxSlots * sizeof(FastBox);
    l.staging_offset = l.records_offset + n * kRecordedRounds * sizeof(RoundRecord);
    l.results_offset = l.staging_offset + n * 2 * l.stage_bytes;
    l.rings_offset = l.results_offset + n * 2 * slice_bytes;
    l.total_bytes = l.rings_offset + n * n * channel_bytes;
    return l;
  }
};

}  // namespace loom::comm::shm
