#pragma once
// The NCCL backend: collectives on the tensors of one GPU per rank, through one non-blocking
// NCCL communicator per process group (comm/nccl/communicator.h).
//
// Setup (collective, in the constructor): rank 0 creates the NCCL unique id and publishes it
// in the group's store; every other rank reads it (waiting at most the group's timeout);
// each creates its communicator on the group's device (GroupOptions::device, else the
// calling thread's current device). Subgroups come from ncclCommSplit of this communicator
// (Backend::split), not from a new unique id.
//
// Note [NCCL operations]
// Every operation, on the thread that runs it (the group's progress thread):
//  1. records an event on the caller's stream (current_stream(device), Note [Issue streams])
//     and makes the device's comm stream wait for it: the collective reads the inputs only
//     after the kernels that produced them, without a host synchronisation;
//  2. enqueues the NCCL call(s) on the comm stream (a non-blocking enqueue that returns
//     ncclInProgress is settled, bounded by the deadline) and marks the tensors' memory as
//     in use on the comm stream (loom::cuda::record_stream);
//  3. records a completion event on the comm stream and makes the caller's stream wait for
//     it, so later kernels on that stream see the result;
//  4. polls the completion event until it is done: the Work completes when the device
//     finished the collective.
//
// Note [NCCL watchdog]
// The poll of step 4 is the watchdog (no extra thread: a backend runs one operation at a
// time and its caller is already waiting for it). Between polls it checks the communicator
// for asynchronous errors (a peer that failed: ncclRemoteError and the like). When the
// deadline passes first, or an error is seen, it calls ncclCommAbort, which also stops the
// operation's kernels so that the streams drain, marks the backend broken and throws
// loom::CommError naming the rank, the operation and the group (the process group adds the
// operation's number and timeout). Later operations fail fast; destroy the group and create
// a new one.
//
// Point-to-point: NCCL matches sends and receives between two ranks by issue order and has
// no tags, so send/recv accept only tag 0 (other tags: loom::Error). all_to_all is one
// ncclGroupStart/End of sends and receives. barrier is an allreduce of one element.
// Element counts of 0 return at once on every rank. Dtypes: f32, f64, bf16, f16, i32, i64, u8.

#include <memory>

#include "comm/backend.h"
#include "comm/nccl/communicator.h"

namespace loom::comm::nccl {

class NcclBackend final : public Backend {
 public:
  // Collective: every rank of the group constructs its backend with the same store.
  explicit NcclBackend(const BackendContext& context);
  ~NcclBackend() override;  // destroys (or, when broken, aborts) the communicator
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda(device_); }

  void allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) override;
  void broadcast(Tensor& tensor, int root, Deadline deadline) override;
  void reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) override;
  void all_gather(Tensor& output, const Tensor& input, Deadline deadline) override;
  void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op, Deadline deadline) override;
  void all_to_all(Tensor& output, const Tensor& input, Deadline deadline) override;
  void send(const Tensor& tensor, int dst, int tag, Deadline deadline) override;
  void recv(Tensor& tensor, int src, int tag, Deadline deadline) override;
  void barrier(Deadline deadline) override;

  bool splits_natively() const override { return true; }
  std::unique_ptr<Backend> split(int color, int key, const BackendContext& child,
                                 Deadline deadline) override;

 private:
  // A subgroup's backend over a communicator made by ncclCommSplit.
  NcclBackend(const BackendContext& context, int device, Communicator communicator);

  // Runs one operation as Note [NCCL operations] describes: `enqueue(stream)` issues the
  // NCCL call(s) on the comm stream and returns the result of the last one; `tensors` are
  // the buffers it touches.
  template <typename Enqueue>
  void run(const char* op, std::initializer_list<const Tensor*> tensors, Deadline deadline,
           Enqueue&& enqueue);
  // loom::CommError when an earlier failure aborted the communicator.
  void check_usable(const char* op) const;
  [[noreturn]] void rethrow_with_rank(const CommError& error) const;
  std::string who() const;

  int rank_, size_, device_;
  std::string group_;
  Duration timeout_;
  Communicator communicator_;
  Tensor barrier_buffer_;  // one f32 on the device, made on the first barrier
};

}  // namespace loom::comm::nccl
