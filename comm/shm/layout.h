#pragma once
// Layout of the shm backend's segment. Control words sit on their own cache lines; each
// counter is written by one rank only (the owner) and read by the others.
//
//   [RankControl x size] [ChannelControl x size*size] [FastBox x size*kFastBoxSlots]
//   [staging: size ranks x 2 buffers x stage_bytes] [results: size x 2 x slice_bytes]
//   [channel rings: size*size x channel_bytes]
//
// See Note [Rounds] in shm_backend.cpp for how the counters are used.

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace loom::comm::shm {

struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
};
static_assert(sizeof(Counter) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

struct RankControl {
  Counter pid;       // process id, written once when the rank attaches
  Counter arrived;   // last round whose data this rank posted
  Counter reduced;   // last round whose reduced slice this rank wrote
  Counter consumed;  // last round this rank finished reading
};

// One cache line that carries a tiny message together with the round it belongs to, so a
// reader that sees the round also has the data (one cache-line transfer per peer).
struct alignas(64) FastBox {
  std::atomic<uint64_t> round{0};
  unsigned char data[56];
};
static_assert(sizeof(FastBox) == 64);
inline constexpr size_t kFastBoxBytes = sizeof(FastBox::data);
inline constexpr uint64_t kFastBoxSlots = 16;  // per rank, used round-robin

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
  size_t ranks_offset = 0, channels_offset = 0, fastbox_offset = 0, staging_offset = 0,
         results_offset = 0, rings_offset = 0, total_bytes = 0;

  static Layout make(int size, size_t slice_bytes, size_t channel_bytes) {
    Layout l;
    l.size = size;
    l.slice_bytes = slice_bytes;
    l.stage_bytes = slice_bytes * static_cast<size_t>(size);
    l.channel_bytes = channel_bytes;
    size_t n = static_cast<size_t>(size);
    l.ranks_offset = 0;
    l.channels_offset = l.ranks_offset + n * sizeof(RankControl);
    l.fastbox_offset = l.channels_offset + n * n * sizeof(ChannelControl);
    l.staging_offset = l.fastbox_offset + n * kFastBoxSlots * sizeof(FastBox);
    l.results_offset = l.staging_offset + n * 2 * l.stage_bytes;
    l.rings_offset = l.results_offset + n * 2 * slice_bytes;
    l.total_bytes = l.rings_offset + n * n * channel_bytes;
    return l;
  }
};

}  // namespace loom::comm::shm
