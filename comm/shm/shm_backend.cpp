#include "comm/shm/shm_backend.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "comm/reduce_op.h"
#include "core/tags.h"
#include "core/tunables.h"

namespace loom::comm::shm {

namespace {

// memcpy, except that nothing is read or written for 0 bytes: the data pointer of a tensor of
// 0 elements may be null, which memcpy may not be given even for 0 bytes.
void copy_bytes(void* to, const void* from, size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

// The largest value a size tunable takes: the segment holds size^2 channel rings and
// 2 * size^2 slices, so a few GiB per rank is already more memory than a host has.
constexpr uint64_t kMaxTunableBytes = uint64_t{1} << 30;

// A size tunable of the shm backend (bytes, 1 to kMaxTunableBytes); its declared default
// (default_text, e.g. "262144") when unset or empty. Only decimal digits are taken: strtoull
// would read "-1" as 2^64 - 1 and saturate on overflow, and a size that wraps when rounded up
// makes the round loops spin forever.
size_t tunable(const Tunable& variable) {
  const char* set = tunable_value(variable);
  const std::string_view text =
      set != nullptr && *set != '\0' ? std::string_view(set) : variable.default_text;
  const char* end = text.data() + text.size();
  uint64_t value = 0;
  const auto [stop, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::invalid_argument || stop != end) {
    tag::kCommShm.fail(
        variable.name, "='", text,
        "' is not a number of bytes: expected decimal digits only (no sign, space or suffix), "
        "from 1 to ",
        kMaxTunableBytes, " (1 GiB)");
  }
  if (ec == std::errc::result_out_of_range || value < 1 || value > kMaxTunableBytes) {
    tag::kCommShm.fail(variable.name, "=", text, " is out of range: expected 1 to ",
                       kMaxTunableBytes, " bytes (1 GiB)");
  }
  return static_cast<size_t>(value);
}

// The three sizes, read once (the first backend of the process reads them).
struct Sizes {
  size_t slice_bytes, one_shot_bytes, channel_bytes;
};

const Sizes& sizes() {
  static const Sizes t{
      (tunable(tunables::kShmSliceBytes) + 63) / 64 * 64,
      tunable(tunables::kShmOneShotBytes),
      (tunable(tunables::kShmChannelBytes) + 63) / 64 * 64,
  };
  return t;
}

double scale_of(ReduceOp op, int size) {
  return op == ReduceOp::Avg ? 1.0 / size : 1.0;
}

}  // namespace

ShmBackend::ShmBackend(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      layout_(Layout::make(context.size, sizes().slice_bytes, sizes().channel_bytes)),
      one_shot_bytes_(std::min(sizes().one_shot_bytes, layout_.stage_bytes)) {
  Deadline deadline = deadline_after(context.timeout);
  Store& store = *context.store;
  if (rank_ == 0) {
    segment_ = Segment::create(layout_.total_bytes);
    segment_control_ =
        new (static_cast<char*>(segment_.data()) + layout_.segment_offset) SegmentControl();
    for (int r = 0; r < size_; ++r)
      new (&control(r)) RankControl();
    for (int s = 0; s < size_; ++s)
      for (int d = 0; d < size_; ++d)
        new (&channel(s, d)) ChannelControl();
    store.set("shm/segment", to_bytes(segment_.name()));
  } else {
    std::string name = to_string(store.get("shm/segment", context.timeout));
    segment_ = Segment::open(name, layout_.total_bytes);
    segment_control_ = reinterpret_cast<SegmentControl*>(static_cast<char*>(segment_.data()) +
                                                        layout_.segment_offset);
  }
  control(rank_).pid.value.store(static_cast<uint64_t>(getpid()), std::memory_order_release);
  store.set("shm/attached/" + std::to_string(rank_), to_bytes("1"));
  if (rank_ == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < size_; ++r)
      keys.push_back("shm/attached/" + std::to_string(r));
    try {
      store.wait(keys, std::chrono::duration_cast<Duration>(deadline - Clock::now()));
    } catch (...) {
      segment_.unlink();
      throw;
    }
    segment_.unlink();  // every rank has it mapped: the name is no longer needed
  }
  consumed_seen_.assign(static_cast<size_t>(size_), 0);
  gathered_.resize(static_cast<size_t>(size_) * kGatheredBytes);
  scope_ = {.rank = rank_,
            .pid_of =
                [this](int r) {
                  return static_cast<int64_t>(
                      control(r).pid.value.load(std::memory_order_acquire));
                },
            .stopped =
                [this](int r) { return control(r).stopped.value.load(std::memory_order_acquire); },
            .stop =
                [this] {
                  control(rank_).stopped.value.store(1, std::memory_order_release);
                  wake_sleepers();
                },
            .doorbell = &control(rank_).doorbell,
            .segment = segment_control_};
}

void ShmBackend::ring_sleeping_peers() const {
  for (int r = 0; r < size_; ++r) {
    Doorbell& bell = control(r).doorbell;
    if (r != rank_ && bell.sleeping.load(std::memory_order_acquire) > 0) ring_doorbell(bell);
  }
}

RankControl& ShmBackend::control(int r) const {
  auto* base = static_cast<char*>(segment_.data()) + layout_.ranks_offset;
  return reinterpret_cast<RankControl*>(base)[r];
}

ChannelControl& ShmBackend::channel(int src, int dst) const {
  auto* base = static_cast<char*>(segment_.data()) + layout_.channels_offset;
  return reinterpret_cast<ChannelControl*>(base)[src * size_ + dst];
}

char* ShmBackend::ring(int src, int dst) const {
  return static_cast<char*>(segment_.data()) + layout_.rings_offset +
         static_cast<size_t>(src * size_ + dst) * layout_.channel_bytes;
}

char* ShmBackend::staging(int r, uint64_t round) const {
  return static_cast<char*>(segment_.data()) + layout_.staging_offset +
         (static_cast<size_t>(r) * 2 + round % 2) * layout_.stage_bytes;
}

FastBox& ShmBackend::fastbox(int r, uint64_t round) const {
  auto* base =
      reinterpret_cast<FastBox*>(static_cast<char*>(segment_.data()) + layout_.fastbox_offset);
  return base[static_cast<size_t>(r) * kFastBoxSlots + round % kFastBoxSlots];
}

RoundRecord& ShmBackend::record(int r, uint64_t round) const {
  auto* base = reinterpret_cast<RoundRecord*>(static_cast<char*>(segment_.data()) +
                                              layout_.records_offset);
  return base[static_cast<size_t>(r) * kRecordedRounds + round % kRecordedRounds];
}

char* ShmBackend::result(int r, uint64_t round) const {
  return static_cast<char*>(segment_.data()) + layout_.results_offset +
         (static_cast<size_t>(r) * 2 + round % 2) * layout_.slice_bytes;
}

std::atomic<uint64_t>& ShmBackend::counter(int r, Phase phase) const {
  RankControl& c = control(r);
  switch (phase) {
    case Phase::Arrived: return c.arrived.value;
    case Phase::Reduced: return c.reduced.value;
    case Phase::Consumed: break;
  }
  return c.consumed.value;
}

// Note [Rounds]
// Every collective is a sequence of rounds, numbered identically on all ranks (round_ counts
// them; collectives are issued in the same order everywhere). Round s uses buffer s % 2 of
// each rank's staging and result areas, so a rank can post round s+1 while its peers still
// read round s (double buffering). Three per-rank counters replace global barriers:
//   arrived  = s once this rank's data for round s is in its staging buffer,
//   reduced  = s once its reduced slice of round s is in its result buffer,
//   consumed = s once it has read everything it needs from round s.
// Before writing buffer s % 2 again in round s, a rank waits until every rank's consumed
// counter reached s - 2, the previous round on the same buffers.
uint64_t ShmBackend::begin_round(Deadline deadline) {
  uint64_t round = ++round_;
  if (round > 2) await_all(Phase::Consumed, round - 2, deadline, "finish reading");
  stamp_round(round);
  control(rank_).arrived.chain[round % 2].store(chain_, std::memory_order_relaxed);
  return round;
}

void ShmBackend::start(const Fingerprint& print) {
  current_ = print;
  current_.seq = collectives_++;
}

// The record is published with the arrived counter or fast box that follows (release).
void ShmBackend::stamp_round(uint64_t round) {
  chain_ = extend_chain(chain_, current_);
  RoundRecord& mine = record(rank_, round);
  mine.chain.store(chain_, std::memory_order_relaxed);
  mine.packed.store(current_.packed(), std::memory_order_relaxed);
  mine.count.store(current_.count, std::memory_order_relaxed);
  mine.seq.store(current_.seq, std::memory_order_relaxed);
  mine.round.store(round, std::memory_order_release);  // last: a reader of it sees the rest
}

// Called once rank r's arrived counter reached `round` (acquire), which makes its chain slot
// of that round visible; the slot is rewritten two staging rounds later at the earliest,
// which needs this rank to have consumed `round` first.
void ShmBackend::check_peer(int r, uint64_t round) const {
  if (control(r).arrived.chain[round % 2].load(std::memory_order_relaxed) != chain_) {
    report_mismatch(r, round);
  }
}

void ShmBackend::check_all(uint64_t round) const {
  for (int r = 0; r < size_; ++r)
    check_peer(r, round);
}

void ShmBackend::report_mismatch(int r, uint64_t round) const {
  auto view_of = [&](int rank, uint64_t s) {
    const RoundRecord& at = record(rank, s);
    return Fingerprint::unpack(at.packed.load(std::memory_order_relaxed),
                               at.count.load(std::memory_order_relaxed),
                               at.seq.load(std::memory_order_relaxed));
  };
  // The first remembered round in which the chains differ is where the ranks parted.
  const uint64_t oldest = round > kRecordedRounds ? round - kRecordedRounds + 1 : 1;
  uint64_t parted = round;
  for (uint64_t s = oldest; s <= round; ++s) {
    if (record(r, s).round.load(std::memory_order_relaxed) == s &&
        record(r, s).chain.load(std::memory_order_relaxed) !=
            record(rank_, s).chain.load(std::memory_order_relaxed)) {
      parted = s;
      break;
    }
  }
  std::string message = tag::kCommShm.prefix() + "rank " + std::to_string(rank_) + ": rank " +
                        std::to_string(r) + " runs a different collective: here " +
                        view_of(rank_, parted).str() + ", on rank " + std::to_string(r) + " ";
  message += record(r, parted).round.load(std::memory_order_relaxed) == parted
                 ? view_of(r, parted).str()
                 : "another one (its record of that round is gone)";
  if (parted == oldest && oldest > 1) {
    message += "; they may have parted earlier, before the oldest of the " +
               std::to_string(kRecordedRounds) + " rounds each rank remembers";
  }
  give_up(scope_, CommError(message +
                                "; every rank must issue the same collectives in the same order, "
                                "with the same counts, dtypes, reduce ops and roots",
                            rank_, r, CommFailure::Mismatch));
}

void ShmBackend::publish(Phase phase, uint64_t round) {
  counter(rank_, phase).store(round, std::memory_order_release);
  wake_sleepers();
}

// A peer awaited for its data of `round` may have run that round on the other path (a tiny
// round, which publishes no arrived counter, against a staging one): its record of the round
// then shows a chain other than ours. Looked at once every 64 checks of the wait, so that a
// peer that is merely late costs nothing more.
void ShmBackend::fail_if_parted(int r, uint64_t round, uint64_t chain) const {
  const RoundRecord& at = record(r, round);
  if (at.round.load(std::memory_order_acquire) == round &&
      at.chain.load(std::memory_order_relaxed) != chain) {
    report_mismatch(r, round);
  }
}

void ShmBackend::await_all(Phase phase, uint64_t round, Deadline deadline, const char* what) {
  auto behind = [&]() -> int {
    for (int r = 0; r < size_; ++r) {
      if (counter(r, phase).load(std::memory_order_acquire) < round) return r;
    }
    return -1;
  };
  uint32_t checks = 0;
  wait_until(
      scope_,
      [&] {
        const int late = behind();
        if (late >= 0 && phase == Phase::Arrived && ++checks % 64 == 0)
          fail_if_parted(late, round, chain_);
        return late < 0;
      },
      behind, deadline, what);
}

void ShmBackend::await_rank(int r, Phase phase, uint64_t round, Deadline deadline,
                            const char* what) {
  auto& c = counter(r, phase);
  uint32_t checks = 0;
  wait_until(
      scope_,
      [&] {
        if (c.load(std::memory_order_acquire) >= round) return true;
        if (phase == Phase::Arrived && ++checks % 64 == 0) fail_if_parted(r, round, chain_);
        return false;
      },
      [r] { return r; }, deadline, what);
}

void ShmBackend::reduce_staged(uint64_t round, size_t offset, size_t count, DType dtype,
                               ReduceOp op, void* out, const void* own) {
  if (count == 0) return;
  const void* inputs[64];
  std::vector<const void*> many;
  const void** list = inputs;
  if (size_ > 64) {
    many.resize(size_);
    list = many.data();
  }
  for (int r = 0; r < size_; ++r)
    list[r] = staging(r, round) + offset;
  if (own != nullptr) list[rank_] = own;
  kernels::cpu::reduce_inputs(dtype, reduce_kind_of(op), out, list,
                              static_cast<size_t>(size_), count, scale_of(op, size_));
}

Fingerprint ShmBackend::allreduce_print(const Tensor& input, ReduceOp op) {
  return {.kind = Collective::Allreduce,
          .dtype = input.dtype(),
          .op = op,
          .count = static_cast<uint64_t>(input.numel())};
}

void ShmBackend::allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) {
  start(allreduce_print(input, op));
  reduce_rounds(input, output, op, /*root=*/-1, deadline);
}

void ShmBackend::reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) {
  start({.kind = Collective::Reduce,
         .dtype = tensor.dtype(),
         .op = op,
         .root = root,
         .count = static_cast<uint64_t>(tensor.numel())});
  reduce_rounds(tensor, tensor, op, root, deadline);
}

// output = reduction of every rank's input, on every rank (root < 0) or on `root` only.
// input and output may be the same tensor: each round reads its part of input before it
// writes that part of output.
void ShmBackend::reduce_rounds(const Tensor& input, Tensor& output, ReduceOp op, int root,
                               Deadline deadline) {
  const DType dtype = input.dtype();
  const size_t element = dtype_size(dtype);
  const size_t n = static_cast<size_t>(input.numel());
  const char* in = static_cast<const char*>(input.raw_data());
  char* out = static_cast<char*>(output.raw_data());
  const bool wanted = root < 0 || root == rank_;
  if (n * element <= kFastBoxBytes) return reduce_tiny(input, output, op, root, deadline);
  if (n * element <= one_shot_bytes_) {
    // One-shot: everyone posts everything; each rank that wants the result reduces it all.
    uint64_t round = begin_round(deadline);
    copy_bytes(staging(rank_, round), in, n * element);
    publish(Phase::Arrived, round);
    await_all(Phase::Arrived, round, deadline, "post its data");
    check_all(round);
    if (wanted) reduce_staged(round, 0, n, dtype, op, out);
    publish(Phase::Consumed, round);
    return;
  }
  // Reduce-scatter + all-gather, one staging buffer per round: rank r reduces slice r.
  const size_t slice = layout_.slice_bytes / element;  // elements per rank per round
  const size_t chunk = slice * static_cast<size_t>(size_);
  for (size_t start = 0; start < n; start += chunk) {
    const size_t length = std::min(chunk, n - start);
    auto slice_range = [&](int r) {
      size_t begin = std::min(length, slice * static_cast<size_t>(r));
      return std::pair<size_t, size_t>{begin, std::min(length, begin + slice) - begin};
    };
    uint64_t round = begin_round(deadline);
    // Peers need every slice but ours; ours is read from the input itself.
    auto [mine, mine_count] = slice_range(rank_);
    copy_bytes(staging(rank_, round), in + start * element, mine * element);
    copy_bytes(staging(rank_, round) + (mine + mine_count) * element,
                in + (start + mine + mine_count) * element, (length - mine - mine_count) * element);
    publish(Phase::Arrived, round);
    await_all(Phase::Arrived, round, deadline, "post its data");
    check_all(round);
    reduce_staged(round, mine * element, mine_count, dtype, op, result(rank_, round),
                  in + (start + mine) * element);
    publish(Phase::Reduced, round);
    if (wanted) {
      await_all(Phase::Reduced, round, deadline, "reduce its slice");
      for (int r = 0; r < size_; ++r) {
        auto [begin, count] = slice_range(r);
        copy_bytes(out + (start + begin) * element, result(r, round), count * element);
      }
    }
    publish(Phase::Consumed, round);
  }
}

// Note [Fast boxes]
// A reduction of at most kFastBoxBytes (4 KiB and 56 bytes) travels in one box per rank, the
// data followed by the number of the round it belongs to: a peer that sees the round number has
// the data too, so the round costs no flag or consumed counter of its own, and up to 56
// bytes a single cache-line transfer per peer. (Boxes of 4 KiB took the staging path's
// one-shot rounds from 64 B to 4 KiB: docs/performance_comm.md, "posted allreduces".) Each rank has
// kFastBoxSlots boxes used round-robin; before reusing the box of round s - kFastBoxSlots a rank
// checks that every peer consumed that round, re-reading the peers' consumed counters only when its
// cached copy is too old (once every few rounds). The reduction reads the boxes in rank order, like
// every other path, so results are the same bits whichever path a size takes. A box is stamped with
// its round's fingerprint chain rather than the round number (Note [Fingerprints]): a reader that
// waits long for a peer's box looks at the peer's record of the round now and then
// (fail_if_parted), and a record of this round with another chain is a mismatch.
//
// The data starts on a cache line and the stamp follows it (FastBox::stamp_offset), so the
// stamp's place depends on the size. The stamp used to come first, the data 8 bytes into the
// line, and a 64-byte f32 allreduce (one AVX-512 load per peer, across two lines) took 1.3x-1.6x
// the time of 56 or 96 bytes: 1.16x-1.22x Open MPI's time, 0.80x now. Why only that case (64
// bytes of bf16 or i32 were not slow) is not known; with the data on a line it is gone. Other
// sizes: 0.84x-1.15x their former time (docs/performance_comm.md, "The 64-byte allreduce").
// Every rank passes the same size, so all look in the same place; a rank that passed another
// size looks elsewhere, never sees its chain, and fail_if_parted finds the mismatch. A data
// word left where a reader looks equals the reader's chain only by a 64-bit hash collision.
void ShmBackend::reduce_tiny(const Tensor& input, Tensor& output, ReduceOp op, int root,
                             Deadline deadline) {
  finish_tiny(post_tiny(input, deadline), output, op, root, deadline);
}

// Note [Lined boxes]
// From 57 bytes the data and the stamp after it take two lines or more, and a reader waited
// for the stamp's line to come over, then for the data's: two transfers between cores one
// after the other (57 to 64 bytes took about 20 ns more than 56 in the fast mode, where Open
// MPI's took 10). Messages of 57 to FastBox::kLinedBytes bytes are lined instead, as NCCL's
// LL128 protocol lines its data: every line carries 56 bytes and the stamp in its last 8,
// written after the data (x86's stores become visible in order, and the release store keeps
// the compiler's order), so a reader that sees the stamp in a line has that line's data. The
// reader loads every line's stamp in each check, and the lines come over together; it then
// gathers each rank's lines into contiguous bytes (gathered_, in L1) for the reduction, which
// reads them in rank order as before: the same bits.
const void* ShmBackend::gather(const FastBox& box, size_t bytes, int r) {
  unsigned char* out = gathered_.data() + static_cast<size_t>(r) * kGatheredBytes;
  for (size_t line = 0; line < FastBox::lines(bytes); ++line)  // whole lines: the rest unused
    std::memcpy(out + line * FastBox::kLineData, box.line(line), FastBox::kLineData);
  return out;
}

ShmBackend::PostedRound ShmBackend::post_tiny(const Tensor& input, Deadline deadline) {
  const uint64_t round = ++round_;
  if (round > kFastBoxSlots) {
    const uint64_t needed = round - kFastBoxSlots;
    for (int r = 0; r < size_; ++r) {
      if (consumed_seen_[r] >= needed) continue;
      await_rank(r, Phase::Consumed, needed, deadline, "finish reading");
      consumed_seen_[r] = counter(r, Phase::Consumed).load(std::memory_order_acquire);
    }
  }
  stamp_round(round);
  FastBox& mine = fastbox(rank_, round);
  const size_t bytes = input.nbytes();
  if (FastBox::lined(bytes)) {
    // Whole lines by a copy of constant size (inlined), the last one by the bytes left.
    const auto* in = static_cast<const unsigned char*>(input.raw_data());
    const size_t last = FastBox::lines(bytes) - 1;
    for (size_t line = 0; line < last; ++line) {
      std::memcpy(mine.line(line), in + line * FastBox::kLineData, FastBox::kLineData);
      mine.line_stamp(line).store(chain_, std::memory_order_release);
    }
    std::memcpy(mine.line(last), in + last * FastBox::kLineData, bytes - last * FastBox::kLineData);
    mine.line_stamp(last).store(chain_, std::memory_order_release);
  } else {
    copy_bytes(mine.data, input.raw_data(), bytes);
    mine.stamp(bytes).store(chain_, std::memory_order_release);
  }
  wake_sleepers();
  claim_next_box(round, bytes);
  // No arrived counter: peers read this round's data from the box alone (a peer that ran this
  // round on a staging path finds it out from this round's record, fail_if_parted).
  return {round, chain_};
}

// Note [Claiming the next box]
// A box's lines were last read by the peers, so writing it first takes them back from their
// caches: a store miss. The store itself does not wait, but the next locked instruction (the
// group's queue lock, a Work's reference count) waits for it, so every call paid a transfer
// between cores in full. Asking for the next round's box for writing (PREFETCHW) as soon as
// this round's is written lets that transfer run while the caller goes on; the lines taken
// are those a call of this size writes. A hint only: nothing is read or written, and the
// box's reuse is still checked against the peers' consumed counters before it is written.
// Measured: asynchronous bursts of 8 B to 4 KiB 0.65x to 0.95x the time, but for 64 B (1.06x,
// with the stamp-first box of the time: Note [Fast boxes]), and synchronous calls from 512 B
// 0.70x to 0.93x (docs/performance_comm.md).
// Prefetching the peers' next boxes for reading measured slower: the line often arrives
// before the peer wrote it, and the peer's write then has to take it back.
void ShmBackend::claim_next_box(uint64_t round, size_t bytes) const {
  const auto* next = reinterpret_cast<const unsigned char*>(&fastbox(rank_, round + 1));
  for (size_t at = 0; at < FastBox::used_bytes(bytes); at += 64)
    __builtin_prefetch(next + at, /*rw=*/1);
}

// Note [Box slots]
// A post that finds kMaxPosted rounds outstanding finishes the oldest first: a rank finishes
// round s, and reads its peers' boxes of round s, in its post of round s + kMaxPosted. Finishing
// s waits for every peer's post of s, so no rank runs more than kMaxPosted rounds ahead of
// another. A rank claims its box for round r + 1 at the end of its post of round r (Note
// [Claiming the next box]); a peer last read that box in round r + 1 - kFastBoxSlots, and
// reads it after the claim, taking the lines back so that the next post's stores wait for them
// again, when it lags by kFastBoxSlots - kMaxPosted - 1 rounds or more. With 16 slots and 8
// posts a lag of 7 or 8 did that, and in a burst the ranks drift until one is a whole window
// ahead. With more than twice kMaxPosted slots no lag reaches it: bursts of 64 to 512 bytes took
// 0.84x-0.97x the time of 16 slots (docs/performance_comm.md, "2026-11-29: box slots"). Fewer
// posts (4 of 16) were as fast with two ranks on two cores, but four ranks on two took 1.7x-2.4x
// the time: a rank whose peer is descheduled goes on posting only as far as kMaxPosted.

// Reads the boxes of a posted round: uses only `posted`, never round_ or chain_, which later
// posts may have moved on (Note [Posted allreduces] in comm/process_group.cpp).
void ShmBackend::finish_tiny(const PostedRound& posted, Tensor& output, ReduceOp op, int root,
                             Deadline deadline) {
  const uint64_t round = posted.round;  // (not a structured binding: clang 14 cannot capture one)
  const uint64_t chain = posted.chain;
  if (root < 0 || root == rank_) {
    const void* inputs[64];
    std::vector<const void*> many;
    const void** list = inputs;
    if (size_ > 64) {
      many.resize(size_);
      list = many.data();
    }
    // (output holds as many bytes as every rank's input: the stamps' place.)
    const size_t bytes = output.nbytes();
    for (int r = 0; r < size_; ++r) {
      FastBox& box = fastbox(r, round);
      if (!box.stamped(bytes, chain)) {
        uint32_t checks = 0;
        wait_until(
            scope_,
            [&] {
              if (box.stamped(bytes, chain)) return true;
              if (++checks % 64 == 0) fail_if_parted(r, round, chain);
              return false;
            },
            [r] { return r; }, deadline, "post its data");
      }
      list[r] = FastBox::lined(bytes) ? gather(box, bytes, r) : box.data;
    }
    kernels::cpu::reduce_inputs(output.dtype(), reduce_kind_of(op), output.raw_data(), list,
                                static_cast<size_t>(size_), static_cast<size_t>(output.numel()),
                                scale_of(op, size_));
  }
  publish(Phase::Consumed, round);
}

size_t ShmBackend::postable_allreduce_bytes() const {
  return kFastBoxBytes;
}

size_t ShmBackend::max_posted() const {
  return kMaxPosted;
}

void ShmBackend::post_allreduce(const Tensor& input, ReduceOp op, Deadline deadline) {
  if (input.nbytes() > kFastBoxBytes || posted_.size() >= kMaxPosted) {
    tag::kCommShm.fail("post_allreduce: ", input.nbytes(), " bytes with ", posted_.size(),
                       " posted (at most ", kFastBoxBytes, " bytes and ", kMaxPosted, ")");
  }
  start(allreduce_print(input, op));
  posted_.push_back(post_tiny(input, deadline));
}

void ShmBackend::finish_allreduce(Tensor& output, ReduceOp op, Deadline deadline) {
  if (posted_.empty()) tag::kCommShm.fail("finish_allreduce: nothing was posted");
  const PostedRound posted = posted_.front();
  posted_.pop_front();
  finish_tiny(posted, output, op, /*root=*/-1, deadline);
}

void ShmBackend::broadcast(Tensor& tensor, int root, Deadline deadline) {
  start({.kind = Collective::Broadcast,
         .dtype = tensor.dtype(),
         .root = root,
         .count = static_cast<uint64_t>(tensor.numel())});
  const size_t bytes = tensor.nbytes();
  char* data = static_cast<char*>(tensor.raw_data());
  for (size_t start = 0; start < bytes || (bytes == 0 && start == 0);
       start += layout_.stage_bytes) {
    const size_t length = std::min(layout_.stage_bytes, bytes - start);
    uint64_t round = begin_round(deadline);
    if (rank_ == root) copy_bytes(staging(rank_, round), data + start, length);
    publish(Phase::Arrived, round);
    if (rank_ != root) {
      await_rank(root, Phase::Arrived, round, deadline, "post its data");
      check_peer(root, round);
      copy_bytes(data + start, staging(root, round), length);
    }
    publish(Phase::Consumed, round);
    if (bytes == 0) break;
  }
}

void ShmBackend::all_gather(Tensor& output, const Tensor& input, Deadline deadline) {
  start({.kind = Collective::AllGather,
         .dtype = input.dtype(),
         .count = static_cast<uint64_t>(input.numel())});
  const size_t bytes = input.nbytes();
  const char* in = static_cast<const char*>(input.raw_data());
  char* out = static_cast<char*>(output.raw_data());
  for (size_t start = 0; start < bytes || (bytes == 0 && start == 0);
       start += layout_.stage_bytes) {
    const size_t length = std::min(layout_.stage_bytes, bytes - start);
    uint64_t round = begin_round(deadline);
    copy_bytes(staging(rank_, round), in + start, length);
    publish(Phase::Arrived, round);
    await_all(Phase::Arrived, round, deadline, "post its data");
    check_all(round);
    for (int r = 0; r < size_; ++r) {
      copy_bytes(out + static_cast<size_t>(r) * bytes + start, staging(r, round), length);
    }
    publish(Phase::Consumed, round);
    if (bytes == 0) break;
  }
}

// Rounds over `size` equal parts of `input` (n elements each): each round stages elements
// [start, start + length) of every part (part j in slot j of this rank's staging buffer),
// waits until all ranks posted, then calls consume(round, start, length, piece), where piece
// is the slot size in elements.
void ShmBackend::exchange_parts(
    const Tensor& input, size_t n, Deadline deadline,
    const std::function<void(uint64_t, size_t, size_t, size_t)>& consume) {
  const size_t element = dtype_size(input.dtype());
  const size_t piece = layout_.slice_bytes / element;
  const char* in = static_cast<const char*>(input.raw_data());
  for (size_t start = 0; start < n || (n == 0 && start == 0); start += piece) {
    const size_t length = std::min(piece, n - start);
    uint64_t round = begin_round(deadline);
    for (int r = 0; r < size_; ++r) {
      copy_bytes(staging(rank_, round) + static_cast<size_t>(r) * piece * element,
                  in + (static_cast<size_t>(r) * n + start) * element, length * element);
    }
    publish(Phase::Arrived, round);
    await_all(Phase::Arrived, round, deadline, "post its data");
    check_all(round);
    consume(round, start, length, piece);
    publish(Phase::Consumed, round);
    if (n == 0) break;
  }
}

void ShmBackend::reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op,
                                Deadline deadline) {
  start({.kind = Collective::ReduceScatter,
         .dtype = input.dtype(),
         .op = op,
         .count = static_cast<uint64_t>(output.numel())});
  const size_t element = dtype_size(input.dtype());
  char* out = static_cast<char*>(output.raw_data());
  exchange_parts(input, static_cast<size_t>(output.numel()), deadline,
                 [&](uint64_t round, size_t start, size_t length, size_t piece) {
                   reduce_staged(round, static_cast<size_t>(rank_) * piece * element, length,
                                 input.dtype(), op, out + start * element);
                 });
}

void ShmBackend::all_to_all(Tensor& output, const Tensor& input, Deadline deadline) {
  start({.kind = Collective::AllToAll,
         .dtype = input.dtype(),
         .count = static_cast<uint64_t>(input.numel())});
  const size_t element = dtype_size(input.dtype());
  const size_t n = static_cast<size_t>(input.numel()) / static_cast<size_t>(size_);
  char* out = static_cast<char*>(output.raw_data());
  exchange_parts(input, n, deadline,
                 [&](uint64_t round, size_t start, size_t length, size_t piece) {
                   for (int r = 0; r < size_; ++r) {
                     copy_bytes(out + (static_cast<size_t>(r) * n + start) * element,
                                 staging(r, round) + static_cast<size_t>(rank_) * piece * element,
                                 length * element);
                   }
                 });
}

void ShmBackend::barrier(Deadline deadline) {
  start({.kind = Collective::Barrier});
  uint64_t round = begin_round(deadline);
  publish(Phase::Arrived, round);
  await_all(Phase::Arrived, round, deadline, "reach the barrier");
  check_all(round);
  publish(Phase::Consumed, round);
}

}  // namespace loom::comm::shm
