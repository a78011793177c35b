#pragma once
// The shared-memory backend: the ranks of one host exchange data through one POSIX shared
// memory segment (comm/shm/segment.h, layout.h). Collectives run in rounds of at most one
// staging buffer per rank (Note [Rounds] in shm_backend.cpp); small reductions use one round
// in which every rank reduces everything (one-shot), large ones a reduce-scatter + all-gather
// per round, in pipelined cache-sized chunks. Every reduction combines the ranks' data in
// rank order 0, 1, ..., size-1 with f32 accumulation for bf16/f16, so results are bitwise
// identical on every rank, from run to run and whichever algorithm the size selects.
// Point-to-point byte streams between every pair of ranks (Transport) carry send/recv and
// the generic algorithms of comm/algorithms/. Ranks whose collectives differ (kind, count,
// dtype, reduce op, root) get a CommError naming both views, always (Note [Fingerprints]).
//
// Tunables (core/tunables.h), read once: LOOM_SHM_SLICE_BYTES (per-rank share of a round,
// default 256 KiB), LOOM_SHM_ONE_SHOT_BYTES (largest one-shot allreduce, default 32 KiB),
// LOOM_SHM_CHANNEL_BYTES (ring of each point-to-point channel, default 256 KiB).

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "comm/transport_backend.h"
#include "comm/shm/fingerprint.h"
#include "comm/shm/layout.h"
#include "comm/shm/peer_wait.h"
#include "comm/shm/segment.h"

namespace loom::comm::shm {

class ShmBackend final : public TransportBackend {
 public:
  // Collective: rank 0 creates the segment and publishes its name through the store; every
  // rank attaches; rank 0 unlinks the name once all have (or the timeout passes).
  explicit ShmBackend(const BackendContext& context);

  std::string name() const override { return "shm"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) override;
  void broadcast(Tensor& tensor, int root, Deadline deadline) override;
  void reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) override;
  void all_gather(Tensor& output, const Tensor& input, Deadline deadline) override;
  void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op, Deadline deadline) override;
  void all_to_all(Tensor& output, const Tensor& input, Deadline deadline) override;
  void barrier(Deadline deadline) override;

  // Allreduces of a fast box's size or less are posted (Note [Posted allreduces] in
  // comm/process_group.cpp): the data goes into this rank's box at once, and the finish reads
  // the peers' boxes. At most kMaxPosted are outstanding, so a peer lags by kMaxPosted rounds at
  // most, and it never reads a box this rank claimed for its next post (Note [Box slots]).
  size_t postable_allreduce_bytes() const override;
  size_t max_posted() const override;
  void post_allreduce(const Tensor& input, ReduceOp op, Deadline deadline) override;
  void finish_allreduce(Tensor& output, ReduceOp op, Deadline deadline) override;

  // Transport: raw byte streams between ranks (TransportBackend makes send/recv of bytes and
  // tensors of it, as on every network backend).
  void send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                 size_t recv_bytes, int src, Deadline deadline) override;

 private:
  enum class Phase { Arrived, Reduced, Consumed };
  // A round whose data this rank put in its fast box, and the chain its peers stamp theirs
  // with.
  struct PostedRound {
    uint64_t round;
    uint64_t chain;
  };
  static constexpr size_t kMaxPosted = 8;
  static_assert(kFastBoxSlots > 2 * kMaxPosted + 1, "Note [Box slots]");

  RankControl& control(int r) const;
  // After a store a peer may wait for: wakes the peers asleep on their doorbells (Note
  // [Doorbells] in comm/shm/layout.h). Inline: every publication passes here.
  void wake_sleepers() const {
    if (anyone_asleep(*segment_control_, fenced_publishing_)) ring_sleeping_peers();
  }
  void ring_sleeping_peers() const;
  ChannelControl& channel(int src, int dst) const;
  char* ring(int src, int dst) const;
  char* staging(int r, uint64_t round) const;
  FastBox& fastbox(int r, uint64_t round) const;
  // Takes this rank's box of round + 1 for writing, `bytes` of it (Note [Claiming the next box]).
  void claim_next_box(uint64_t round, size_t bytes) const;
  RoundRecord& record(int r, uint64_t round) const;
  char* result(int r, uint64_t round) const;
  std::atomic<uint64_t>& counter(int r, Phase phase) const;

  // Every collective starts here: what it is, for the fingerprint of each of its rounds.
  void start(const Fingerprint& print);
  // An allreduce's fingerprint, posted or not.
  static Fingerprint allreduce_print(const Tensor& input, ReduceOp op);
  // Starts the next round: waits until every rank finished reading the round that last
  // used this round's buffers, then records the round and publishes its chain slot.
  uint64_t begin_round(Deadline deadline);
  // Extends the chain with the current collective and records round `round`.
  void stamp_round(uint64_t round);
  // After waiting for rank r's data of a staging round: throws unless r's chain equals ours.
  void check_peer(int r, uint64_t round) const;
  void check_all(uint64_t round) const;
  // Throws the CommError that names this rank's and rank r's view of the first round in
  // which their chains differ.
  [[noreturn]] void report_mismatch(int r, uint64_t round) const;
  void publish(Phase phase, uint64_t round);
  // Throws the mismatch if rank r's record of `round` shows a chain other than `chain`.
  void fail_if_parted(int r, uint64_t round, uint64_t chain) const;
  void await_all(Phase phase, uint64_t round, Deadline deadline, const char* what);
  void await_rank(int r, Phase phase, uint64_t round, Deadline deadline, const char* what);

  // Reduces `count` elements at byte offset `offset` of every rank's staging buffer of
  // `round`, in rank order, into `out`; this rank's contribution is read from `own` instead
  // of its staging buffer when given.
  void reduce_staged(uint64_t round, size_t offset, size_t count, DType dtype, ReduceOp op,
                     void* out, const void* own = nullptr);
  void reduce_rounds(const Tensor& input, Tensor& output, ReduceOp op, int root, Deadline deadline);
  // Allreduce of at most kFastBoxBytes through the fast boxes (Note [Fast boxes]).
  void reduce_tiny(const Tensor& input, Tensor& output, ReduceOp op, int root, Deadline deadline);
  // reduce_tiny's two halves: put this rank's data in its box of the next round; then wait
  // for the peers' boxes of that round and reduce them (root < 0: on every rank).
  PostedRound post_tiny(const Tensor& input, Deadline deadline);
  void finish_tiny(const PostedRound& posted, Tensor& output, ReduceOp op, int root,
                   Deadline deadline);
  // A lined message's data gathered into rank r's part of gathered_ (Note [Lined boxes]).
  const void* gather(const FastBox& box, size_t bytes, int r);
  static constexpr size_t kGatheredBytes =
      FastBox::lines(FastBox::kLinedBytes) * FastBox::kLineData;
  void exchange_parts(const Tensor& input, size_t n, Deadline deadline,
                      const std::function<void(uint64_t, size_t, size_t, size_t)>& consume);

  size_t push(int dst, const char* data, size_t bytes);
  size_t pull(int src, char* data, size_t bytes);

  int rank_, size_;
  Layout layout_;
  Segment segment_;
  SegmentControl* segment_control_ = nullptr;  // at the start of segment_
  WaitScope scope_;
  // Whether this process's publications need a fence before they look for sleepers (Note
  // [Doorbells] in comm/shm/layout.h).
  bool fenced_publishing_ = !publish_without_fence();
  uint64_t round_ = 0;
  Fingerprint current_;            // the collective now running (Note [Fingerprints])
  uint64_t chain_ = kChainStart;   // this rank's chain after round_
  uint64_t collectives_ = 0;       // collectives started, for messages
  std::vector<uint64_t> consumed_seen_;  // last value read of each rank's consumed counter
  size_t one_shot_bytes_;
  std::deque<PostedRound> posted_;  // posted and not yet finished, oldest first
  // Each rank's lined message gathered into contiguous bytes for the reduction (Note [Lined
  // boxes]): FastBox::lines(kLinedBytes) * kLineData bytes per rank.
  std::vector<unsigned char> gathered_;
};

}  // namespace loom::comm::shm
