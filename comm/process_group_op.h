#pragma once
// Internal to comm/process_group*.cpp: the definition of ProcessGroup::Op, shared by the
// entry points that make operations (process_group_calls.cpp) and the queue that runs them
// (process_group.cpp), and what a group tells the backend it creates.

#include "comm/backend.h"
#include "comm/process_group.h"
#include "comm/store/store.h"

namespace loom::comm {

// A tensor's bytes, [begin, end).
struct ByteRange {
  const std::byte* begin = nullptr;
  const std::byte* end = nullptr;
};

// One queued operation: what it is (for errors and debug checks) and how to run it.
// Note [Operation bodies]: the body receives the operation's (up to two) tensors as arguments
// rather than capturing them, so that an operation run on the calling thread copies no tensor
// handle at all; a queued operation keeps its own copies in `first` and `second`. Bodies
// capture a few scalars, which std::function keeps without allocating.
struct ProcessGroup::Op {
  OpKind kind = OpKind::Barrier;
  OpLabel label;          // submit() fills in the sequence number
  std::string signature;  // debug checks only: "allreduce 1024 f32 sum", equal on every rank
  bool collective = true;
  bool staged = false;  // CUDA tensors on a host backend: run through staged_
  IssueStream stream;   // CUDA tensors: the issuing thread's stream (Note [Issue streams])
  Duration timeout;
  WorkPtr work = nullptr;
  Tensor first, second;    // queued operations only
  OpBody body;             // queued operations only
  bool flight_started = false;  // the entry has its start (recorded once)
  ByteRange output_bytes;  // a posted allreduce's output (a later post reading it waits)
  // Queued alone on an idle group, small: the waiting thread may run it (Note [Claimable
  // operations]) until kClaimWindow after the progress thread first saw it.
  bool claimable = false;
  std::optional<Clock::time_point> seen_at;  // by the progress thread, on its own clock

  // Before its Work completes: the caller may free or measure its memory as soon as wait()
  // returns, so the operation's references to the tensors go first.
  void drop_inputs() {
    first = Tensor();
    second = Tensor();
    body = nullptr;
  }
};

// The body of an allreduce: run by the caller, queued, or submitted by post() when it cannot
// post.
inline auto allreduce_body(ReduceOp reduce) {
  return [reduce](Backend& b, Deadline d, Tensor& in, Tensor& out) {
    b.allreduce(in, out, reduce, d);
  };
}

// The context of the backend of group `name` (a new group, or a split's subgroup): its
// store keys live under "pg/<name>/".
inline BackendContext group_backend_context(int rank, int size, const std::shared_ptr<Store>& store,
                                            const GroupOptions& options, const std::string& name) {
  return {.rank = rank,
          .size = size,
          .store = std::make_shared<PrefixStore>("pg/" + name, store),
          .timeout = options.timeout,
          .group_name = name,
          .device = options.device,
          .world_ranks = options.world_ranks};
}

}  // namespace loom::comm
