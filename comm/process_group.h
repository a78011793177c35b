#pragma once
// ProcessGroup: a group of ranks and the collectives among them.
//
//   auto pg = loom::comm::init();                       // from loomrun/torchrun/Slurm/MPI env
//   pg->allreduce(grad, {.op = ReduceOp::Avg})->wait();
//   auto half = pg->split(pg->rank() % 2, pg->rank());  // subgroups
//
// Every call validates its arguments on the calling thread (loom::Error on misuse), then
// queues the operation and returns a Work at once. One progress thread per group runs the
// operations in issue order, so operations issued in the same order on every rank run in
// that order. Tensors must stay alive and unmodified until their Work completes.
// A failed operation (loom::CommError) breaks the group: later calls fail fast.
// Devices: the tensors of one operation share one device. A host backend (shm) takes CPU
// tensors, and CUDA tensors too, staged through pinned host memory (Note [Staging CUDA
// tensors] in comm/cuda/staging_backend.h); the nccl backend takes the tensors of its GPU.
// Operations on CUDA tensors are ordered after the work the caller queued on its current
// stream before issuing them, and work queued there afterwards sees their results (Note
// [Issue streams] in comm/cuda_support.h); their Work completes when the device is done.
// With LOOM_DEBUG=detail every rank checks, before each collective, that all ranks issued
// the same operation with the same count, dtype, op and root, and reports the first
// mismatch with both ranks' views instead of hanging or corrupting memory.

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/backend.h"
#include "comm/environment.h"
#include "comm/flight_recorder.h"
#include "comm/work.h"

namespace loom::comm {

struct CollectiveOptions {
  ReduceOp op = ReduceOp::Sum;
  int root = 0;                                    // broadcast, reduce
  std::optional<Duration> timeout = std::nullopt;  // default: the group's timeout
  // false: the call returns only once the operation completed (its Work is done; errors are
  // thrown from wait() as usual). When nothing else is queued the operation then runs on the
  // calling thread, which saves the hand-off to the progress thread (latency-bound calls).
  bool async_op = true;
};

struct P2POptions {
  int tag = 0;
  std::optional<Duration> timeout = std::nullopt;
  bool async_op = true;  // as in CollectiveOptions
};

struct GroupOptions {
  std::string backend = "auto";
  Duration timeout = kDefaultTimeout;
  bool debug_checks = false;  // also enabled by LOOM_DEBUG=detail
  // The device of the group's tensors. "auto" picks the backend from it ("nccl" for a GPU,
  // "shm" for the CPU, which is also the default), and the nccl backend binds its
  // communicator to it (default: the calling thread's current GPU).
  std::optional<Device> device = std::nullopt;
  // Times operations with the precise clock rather than the coarse one (Note [Operation
  // times] in comm/process_group.cpp); also enabled by LOOM_COMM_TIMING=1.
  bool precise_times = false;
  // The members' ranks in the job's world group, in this group's rank order, when its creator
  // knows them (a simulated split: ProcessGroup::split_by); null: unknown, or the world itself.
  // The sim backend's network model places the members on nodes by them.
  std::shared_ptr<const std::vector<int>> world_ranks = nullptr;
};

// Final: it implements Claimer, whose destructor is not virtual (clang warned at every
// shared_ptr<ProcessGroup> deleter, -Wdelete-non-abstract-non-virtual-dtor).
class ProcessGroup final : public std::enable_shared_from_this<ProcessGroup>, private Claimer {
 public:
  // Joins a group of `size` ranks that rendezvous through `store`. Collective: every rank
  // must construct its group with the same backend and store.
  ProcessGroup(int rank, int size, std::shared_ptr<Store> store, const GroupOptions& options = {},
               std::string name = "default");
  ~ProcessGroup();  // finishes queued operations (bounded by their timeouts), then stops
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string backend_name() const { return backend_->name(); }
  // Where the backend's own tensors live: the CPU for host backends (which also take CUDA
  // tensors, staged), the group's GPU for nccl. Helpers that make their own buffers (metric
  // syncs, model checks) put them here.
  Device device() const { return backend_->device(); }
  const std::string& name() const { return name_; }
  Duration timeout() const { return options_.timeout; }

  WorkPtr allreduce(Tensor& tensor, const CollectiveOptions& options = {});
  // Out of place: output = reduction of every rank's input; input is left unchanged.
  WorkPtr allreduce(const Tensor& input, Tensor& output, const CollectiveOptions& options = {});
  WorkPtr broadcast(Tensor& tensor, const CollectiveOptions& options = {});
  WorkPtr reduce(Tensor& tensor, const CollectiveOptions& options = {});
  // output [size * n] gathers every rank's input [n]; input may be this rank's slice of
  // output (in place).
  WorkPtr all_gather(Tensor& output, const Tensor& input, const CollectiveOptions& options = {});
  // output [n] receives this rank's slice of the reduction of the inputs [size * n]; output
  // may be this rank's slice of input (in place).
  WorkPtr reduce_scatter(Tensor& output, const Tensor& input,
                         const CollectiveOptions& options = {});
  WorkPtr all_to_all(Tensor& output, const Tensor& input, const CollectiveOptions& options = {});
  WorkPtr send(const Tensor& tensor, int dst, const P2POptions& options = {});
  WorkPtr recv(Tensor& tensor, int src, const P2POptions& options = {});
  WorkPtr barrier(const CollectiveOptions& options = {});

  // Operations issued on this group so far, by kind ("allreduce", "all_gather", ...): how
  // many, and their bytes as nccl-tests size them: the larger of an operation's tensors, so
  // the whole gathered or scattered buffer for all_gather and reduce_scatter. For
  // benchmarks and reports; thread-safe.
  struct Traffic {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  std::map<std::string, Traffic, std::less<>> traffic() const;

  // Collective over this group: ranks passing the same color form a new group, ordered by
  // (key, rank). A negative color joins no group and gets nullptr. A backend that splits
  // natively (nccl) does so in issue order after this group's earlier operations.
  std::shared_ptr<ProcessGroup> split(int color, int key);
  // A split where every rank knows every rank's (color, key): `assignment(r)` for each rank r
  // of this group (a mesh's coordinates). The same groups as split(assignment(rank())); a
  // simulated group, whose other ranks do not exist to publish their colors
  // (Backend::runs_at_issue), makes its subgroup from the assignment alone.
  using SplitAssignment = std::function<std::pair<int, int>(int rank)>;
  std::shared_ptr<ProcessGroup> split_by(const SplitAssignment& assignment);

  // From now on, times this group's operations with the precise clock (GroupOptions::
  // precise_times): for traces that show each operation as it ran. Thread-safe.
  void time_precisely() { precise_times_.store(true, std::memory_order_relaxed); }

 private:
  struct Op;  // comm/process_group_op.h
  // The kinds of operation, for the traffic counts (kOpKindNames in process_group_calls.cpp).
  enum class OpKind : uint8_t {
    Allreduce, Broadcast, Reduce, AllGather, ReduceScatter, AllToAll, Send, Recv, Barrier,
    Split, Count
  };
  // A subgroup over a backend made by Backend::split.
  ProcessGroup(int rank, int size, std::shared_ptr<Store> store, const GroupOptions& options,
               std::string name, std::unique_ptr<Backend> backend);
  // Checks rank, size and store, then creates the backend `options` name.
  static std::unique_ptr<Backend> create(int rank, int size, const std::shared_ptr<Store>& store,
                                         const GroupOptions& options, const std::string& name);
  // Checks that an operation's tensors are on one device the backend can take, and sets up
  // staging and the issue stream for CUDA tensors (Note [Devices of a group]).
  void place(Op& op, const Tensor& first, const Tensor* second);
  // The optionals by reference: built by the caller just before the call, an optional passed
  // by value is stored in parts and loaded whole (a failed store forward per call).
  Op make_op(OpKind kind, const Tensor* data, const std::optional<ReduceOp>& op,
             const std::optional<int>& root, const std::optional<Duration>& timeout) const;
  // What an operation does, given its (up to two) tensors: Note [Operation bodies].
  using OpBody = std::function<void(Backend&, Deadline, Tensor&, Tensor&)>;
  // Issues an operation: runs it on the calling thread or queues it (process_group.cpp).
  WorkPtr submit(Op&& op, const Tensor& first, const Tensor& second, OpBody body, bool async_op);
  // Numbers and counts an operation (under the lock); `starts`: it runs on this thread now.
  void enter(Op& op, int64_t bytes, Clock::time_point issued, bool starts);
  // An asynchronous allreduce the backend can post (Note [Posted allreduces]); submitted as
  // usual when something is queued or running.
  WorkPtr post(Op&& op, const Tensor& input, Tensor& output, ReduceOp reduce);
  // Under the lock: `op` moved into a spare Op when there is one; spent Ops kept for reuse.
  std::unique_ptr<Op> reuse_op(Op&& op);
  void keep_spares(std::vector<std::unique_ptr<Op>>& spent);
  // Under the lock, with running_ clear: sets it, and recycles the spent Ops in claimed_.
  void take_running();
  // Runs `ops` in order on this thread, which holds running_, the first starting at `clock`,
  // each after the one before; after one that breaks the group, fails the rest unstarted.
  // True when one broke it. `clock` ends as the last one's completion time.
  bool run_in_order(std::vector<std::unique_ptr<Op>>& ops, Clock::time_point& clock);
  // mutex_, taken with a short spin first (Note [Locking the queue]).
  std::unique_lock<std::mutex> lock_queue();
  void progress_loop();
  // Runs operation `seq` on the calling thread if it is next (posted, or the queue's front
  // after the posted ones) and nothing runs.
  bool claim(uint64_t seq) override;
  // After an operation ran on a calling thread: clears running_, hands queued work on.
  void done_running_here();
  std::exception_ptr broken_error(const Op& op) const;
  // The time of an operation's phases (Note [Operation times]).
  Clock::time_point op_time() const;
  // Runs one operation, starting at `clock`, which becomes its completion time (unchanged
  // for a post that succeeded). finishes = false: a post, whose Work completes when it is
  // finished (or when it fails).
  template <typename Body>
  bool run(Op& op, Body&& body, Clock::time_point& clock, bool finishes = true);
  // Completes a queued operation that will not run because the group is broken (under the
  // lock: broken_error reads broken_).
  void fail_unstarted(Op& op, Clock::time_point now);

  int rank_, size_;
  std::shared_ptr<Store> store_;
  GroupOptions options_;
  std::string name_;
  FlightRecorder::Log* flight_ = nullptr;  // this group's operations in the FlightRecorder
  std::unique_ptr<Backend> backend_;
  // backend_ on CUDA tensors, when backend_ is a host backend; made on first use.
  std::unique_ptr<Backend> staged_;
  std::once_flag staged_once_;
  uint64_t next_seq_ = 0;
  int splits_ = 0;

  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<std::unique_ptr<Op>> queue_;
  // Posted allreduces not yet finished, oldest first; all issued before anything in queue_.
  std::deque<std::unique_ptr<Op>> posted_;
  // Operations a calling thread takes to run (claims, posts, inline operations): only the
  // holder of running_ touches it; it leaves the spent Ops for the next holder to recycle.
  std::vector<std::unique_ptr<Op>> claimed_;
  std::vector<std::unique_ptr<Op>> spare_ops_;  // run and emptied, for submit() to reuse
  bool stopping_ = false;
  // An operation is executing (on the progress or a calling thread); see Note [Inline
  // operations] in process_group.cpp.
  std::atomic<bool> running_{false};
  std::atomic<int> queued_count_{0};  // size of queue_: written under the mutex, read without
  // The progress thread's idle state (Note [Idle progress thread] in process_group.cpp), both
  // under mutex_: it polls (wakes every kClaimWindow) while it saw a claimable operation
  // issued within kIdlePollSpan, and only then may submit() queue one without waking it.
  bool progress_polling_ = false;
  uint64_t claimables_issued_ = 0;          // counted by the issuing threads, watched by the poller
  std::atomic<bool> precise_times_{false};  // Note [Operation times]
  bool runs_at_issue_ = false;              // backend_->runs_at_issue(), asked once
  // Counted on every call under mutex_, read by traffic() without it (relaxed: statistics).
  struct TrafficCounter {
    std::atomic<int64_t> calls{0}, bytes{0};
  };
  std::array<TrafficCounter, static_cast<size_t>(OpKind::Count)> traffic_;
  std::exception_ptr broken_;
  std::thread progress_;
};

struct InitOptions {
  std::string backend = "auto";
  Duration timeout = kDefaultTimeout;
  // Explicit rank/size/store; when the store is null, ranks rendezvous through a TCP store
  // at MASTER_ADDR:MASTER_PORT (served by loomrun, or by rank 0 when none is running).
  std::optional<int> rank = std::nullopt;
  std::optional<int> size = std::nullopt;
  std::shared_ptr<Store> store = nullptr;
  // Where this process sits in the job; detected from the environment when absent.
  std::optional<ClusterEnv> environment = std::nullopt;
  // The device of the default group's tensors (GroupOptions::device); "auto" picks "nccl"
  // for a GPU. Typically loom::Device::cuda(local_rank).
  std::optional<Device> device = std::nullopt;
};

// The default group of this job, from the cluster environment (comm/environment.h).
std::shared_ptr<ProcessGroup> init(const InitOptions& options = {});

// Name of the default group: each restart attempt (loomrun --max-restarts) rendezvouses under
// fresh store keys. Programs that start their own ranks use it so that ranks joining
// through init() meet them.
std::string default_group_name(int restart_count = 0);

}  // namespace loom::comm
