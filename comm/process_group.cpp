// ProcessGroup's queue: operations issued by the entry points (process_group_calls.cpp) run
// in issue order, on the calling thread when it waits for them anyway (inline operations,
// claims, posted allreduces) or on the group's progress thread.

#include "comm/process_group.h"

#include <algorithm>
#include <string_view>

#include "comm/backend_registry.h"
#include "comm/cpu_relax.h"
#include "comm/cuda_support.h"
#include "comm/debug_check.h"
#include "comm/flight_recorder.h"
#include "comm/process_group_op.h"
#include "core/tags.h"
#include "core/tunables.h"

namespace loom::comm {

namespace {

// LOOM_DEBUG: unset or empty (off), or "detail". Any other value is loom::Error rather than
// ignored: a misspelt setting would run the job without the checks that were asked for.
bool debug_from_env() {
  static const bool enabled = [] {
    const char* v = tunable_value(tunables::kDebug);
    if (v == nullptr || *v == '\0') return false;
    if (std::string_view(v) == "detail") return true;
    tag::kComm.fail(tunables::kDebug.name, "='", v,
                    "' is not a known setting; expected 'detail' (or unset)");
  }();
  return enabled;
}

// LOOM_COMM_TIMING: unset, empty or 0 (the coarse clock), or 1 (the precise one: Note
// [Operation times]). Any other value is loom::Error, as for LOOM_DEBUG.
bool precise_times_from_env() {
  static const bool enabled = [] {
    const char* v = tunable_value(tunables::kCommTiming);
    if (v == nullptr || *v == '\0' || std::string_view(v) == "0") return false;
    if (std::string_view(v) == "1") return true;
    tag::kComm.fail(
        tunables::kCommTiming.name, "='", v,
        "' is not a known setting; expected 1 (the precise clock) or 0 (the coarse one, "
        "the default)");
  }();
  return enabled;
}

// Reads the settings of LOOM_DEBUG, LOOM_COMM_TIMING and LOOM_FLIGHT_RECORDER (loom::Error for
// a value they do not know) before the backend's rendezvous, so that every rank refuses a bad
// value at once rather than after waiting for the others.
void check_debug_settings() {
  (void)debug_from_env();
  (void)precise_times_from_env();
  (void)FlightRecorder::global();
}

// The bytes of a contiguous tensor, [begin, end).
ByteRange bytes_of(const Tensor& t) {
  const auto* begin = static_cast<const std::byte*>(t.raw_data());
  return {begin, begin + t.nbytes()};
}

bool overlaps(const ByteRange& a, const ByteRange& b) {
  return a.begin < b.end && b.begin < a.end;
}

// The finish of a posted allreduce, one capture-free body per ReduceOp. A std::function keeps
// a capture in its 16-byte buffer, and the Op's move into its queue slot copied that buffer
// right after the 4-byte capture was stored into it: a failed store forward on every post.
template <ReduceOp kReduce>
constexpr auto kFinishPosted = [](Backend& backend, Deadline deadline, Tensor&, Tensor& out) {
  backend.finish_allreduce(out, kReduce, deadline);
};

}  // namespace

namespace {
// Note [Claimable operations]
// A small asynchronous collective is usually waited for at once (a loss value, an inf/NaN
// flag, a metric): handing it to the progress thread and its completion back costs more
// than the operation. So when one is queued on an idle group, the progress thread leaves
// it for kClaimWindow, and a thread that calls wait() on its Work meanwhile runs it itself,
// as an async_op = false call would. Nothing else changes: operations still run one at a
// time in issue order (only the queue's front, with nothing running, can be claimed), and a
// caller that does not wait (or queues more behind it) has it started by the progress
// thread kClaimWindow after that thread first saw it (within kLongestPoll of its queueing:
// Note [Idle progress thread]), so no program that relied on asynchrony waits on itself. The
// window is timed on the progress thread's clock, not from the issue time: the issuing thread
// reads only the coarse clock (Note [Operation times]). Point-to-point operations are never
// claimable: a receive posted ahead must not block its poster.
constexpr size_t kClaimableBytes = 4096;
constexpr auto kClaimWindow = std::chrono::microseconds(50);

// Note [Idle progress thread]
// Waking the progress thread costs a system call on the issuing thread and a context switch
// that, on a machine with as many busy threads as cores, takes the core another rank's caller
// needs: for a claimable operation that its waiter then runs itself, that wake-up was most of
// the cost of the call. So for kIdlePollSpan after it saw a claimable operation issued, the idle
// progress thread polls instead of sleeping until notified, and submit() does not wake it for
// a claimable operation: a poll finds the operation if its waiter has not run it, and starts
// it kClaimWindow after the first poll that saw it (a posted allreduce: at the next poll).
// Polls that find nothing to run double the period, from kClaimWindow up to kLongestPoll, and
// a poll or wake-up that runs something resets it. So an operation nobody waits for starts
// within twice kLongestPoll at worst, while a stream of calls run by their waiters costs a wake-up
// per kLongestPoll instead of one per call: a wake every 200 us instead of 800 cost two-rank
// `loom-perf -z 2` calls 1.9x the time (docs/performance_comm.md). Any other operation
// still wakes the thread at once. After kIdlePollSpan without a claimable operation it
// sleeps until notified, so an idle group, or one whose small calls are synchronous (run on
// the caller's thread), costs nothing.
constexpr auto kIdlePollSpan = std::chrono::milliseconds(1);
constexpr auto kLongestPoll = std::chrono::microseconds(800);
// Spent operations kept for reuse (ProcessGroup::spare_ops_).
constexpr size_t kSpareOps = 64;
}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, std::shared_ptr<Store> store,
                           const GroupOptions& options, std::string name)
    : ProcessGroup(rank, size, store, options, name, create(rank, size, store, options, name)) {}

ProcessGroup::ProcessGroup(int rank, int size, std::shared_ptr<Store> store,
                           const GroupOptions& options, std::string name,
                           std::unique_ptr<Backend> backend)
    : rank_(rank),
      size_(size),
      store_(std::move(store)),
      options_(options),
      name_(std::move(name)),
      backend_(std::move(backend)) {
  FlightRecorder::check_dump_directory();
  options_.debug_checks = options_.debug_checks || debug_from_env();
  precise_times_.store(options_.precise_times || precise_times_from_env(),
                       std::memory_order_relaxed);
  FlightRecorder::global().note_rank(rank_);
  flight_ = &FlightRecorder::global().register_group(name_, rank_, size_);
  FlightRecorder::install_signal_dump();
  runs_at_issue_ = backend_->runs_at_issue();
  progress_ = std::thread([this] { progress_loop(); });
}

std::unique_ptr<Backend> ProcessGroup::create(int rank, int size,
                                              const std::shared_ptr<Store>& store,
                                              const GroupOptions& options,
                                              const std::string& name) {
  if (size < 1 || rank < 0 || rank >= size) {
    tag::kComm.fail("ProcessGroup: rank ", rank, " is not in [0, ", size, ")");
  }
  if (!store) tag::kComm.fail("ProcessGroup: a store is required");
  check_debug_settings();
  std::string backend = options.backend;
  if (backend == "auto") {
    // A group made directly, outside comm::init (which knows the job), is taken to run on
    // one host.
    backend = resolve_auto_backend(
        backend_needs(single_host_job(size), options.device.value_or(Device::cpu())));
  }
  return BackendRegistry::create(backend, group_backend_context(rank, size, store, options, name));
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (progress_.joinable()) progress_.join();
  FlightRecorder::global().close_group(*flight_);
}

// Note [Inline operations]
// An operation with async_op = false runs on the calling thread when nothing is queued or
// running; running_ (set under the mutex, cleared without it) keeps the progress thread from
// starting another operation meanwhile. When a caller's operation ends, it clears running_
// and then reads queued_count_: a thread that queued work meanwhile counted it there before
// notifying, and the caller notifies again when it sees the count. The clearing is a release
// store with no fence after it (on x86 a seq_cst store is an exchange, which waits for the
// operation's stores to the peers' lines to drain: 5% of a small posted allreduce,
// docs/performance_comm.md 2026-11-29 "running_ without a fence"), so the two can miss each
// other: the notifier's wake-up finds running_ still set while the caller reads the count from
// before the increment. Such a miss happens only within a store's drain (nanoseconds) of the
// queueing. So the progress thread never sleeps untimed while it sees work queued behind a
// caller's operation: it polls, from kClaimWindow after it first sees more queued (doubling up
// to kLongestPoll while nothing changes), and a lost notification costs at most kClaimWindow.

// Note [Operation times]
// An operation's phases (issued, started, completed) are timed for its Work (started_at,
// completed_at), the flight recorder and its deadline. A read of the precise clock costs
// about 20 ns, and a small allreduce takes two (issue and completion): a tenth of its time
// (docs/performance_comm.md, 2026-11-28). So by default a group reads the coarse clock
// (coarse_now(): the time of the last timer tick, a few ms behind), precise enough to tell
// a hung operation from a slow one, and reads the precise clock only when asked to
// (GroupOptions::precise_times, LOOM_COMM_TIMING=1, or time_precisely(), which DDP calls when
// a trace records its buckets), as PyTorch times NCCL operations only under
// TORCH_NCCL_ENABLE_TIMING. Nothing else depends on the choice: a deadline is counted from
// the start plus the coarse clock's lag (coarse_clock_lag(): two ticks, as a tick can come
// late), so it is not early, and the progress thread times
// claim windows on its own precise clock (Note [Claimable operations]).
Clock::time_point ProcessGroup::op_time() const {
  return precise_times_.load(std::memory_order_relaxed) ? Clock::now() : coarse_now();
}

// Numbers an operation and counts it (under the lock).
void ProcessGroup::enter(Op& op, int64_t bytes, Clock::time_point issued, bool starts) {
  // One writer at a time (the lock's holder): a load and a store, no locked instruction.
  TrafficCounter& traffic = traffic_[static_cast<size_t>(op.kind)];
  traffic.calls.store(traffic.calls.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  traffic.bytes.store(traffic.bytes.load(std::memory_order_relaxed) + bytes,
                      std::memory_order_relaxed);
  op.label.seq = next_seq_++;
  op.work->set_seq(op.label.seq);
  flight_->record(op.label, issued, starts);
  op.flight_started = starts;
}

// Issues one operation: runs it on the calling thread when the caller waits for it anyway
// and nothing is ahead of it (no allocation for the body, no hand-off), else queues it for the
// progress thread.
WorkPtr ProcessGroup::submit(Op&& op, const Tensor& first, const Tensor& second, OpBody body,
                             bool async_op) {
  const auto bytes = static_cast<int64_t>(
      std::max(first.defined() ? first.nbytes() : 0, second.defined() ? second.nbytes() : 0));
  // One clock read serves the record, and the start of an operation run here.
  const Clock::time_point issued = op_time();
  // Made before taking the lock, which the progress thread needs for every operation.
  op.work = std::make_shared<Work>(op.label, op.timeout);
  std::unique_lock lock = lock_queue();
  // A simulated backend's operations all run here, so nothing is ever queued for it.
  const bool inline_run = (!async_op || runs_at_issue_) && queue_.empty() && !running_;
  enter(op, bytes, issued, inline_run && !broken_);
  if (broken_) {
    fail_unstarted(op, issued);
    return std::move(op.work);
  }
  if (inline_run) {
    take_running();
    for (std::unique_ptr<Op>& ahead : posted_)  // posted allreduces finish first
      claimed_.push_back(std::move(ahead));
    posted_.clear();
    lock.unlock();
    // The caller's tensors outlive this call; the handles are not modified, only the data.
    Clock::time_point clock = issued;
    if (!run_in_order(claimed_, clock)) {
      run(
          op,
          [&](Backend& backend, Deadline deadline) {
            body(backend, deadline, const_cast<Tensor&>(first), const_cast<Tensor&>(second));
          },
          clock);
    } else {
      std::lock_guard relock(mutex_);
      fail_unstarted(op, op_time());
    }
    done_running_here();
    // A synchronous call waits for its operation, which the simulation's clock sees
    // (WaitObserver); a real one has completed by now.
    if (runs_at_issue_) {
      if (WaitObserver* observer = wait_observer()) observer->issued(*op.work);
      if (!async_op) op.work->wait();
    }
    return std::move(op.work);
  }
  WorkPtr work = op.work;
  op.first = first;
  op.second = second;
  op.body = std::move(body);
  op.claimable = async_op && op.collective && !op.staged &&
                 (!first.defined() || first.device().is_cpu()) &&
                 queue_.empty() && !running_ && op.label.bytes <= kClaimableBytes;
  if (op.claimable) {
    ++claimables_issued_;
    work->offer_claim(this);
  }
  const bool wake = !(op.claimable && progress_polling_);
  queue_.push_back(reuse_op(std::move(op)));
  // Under the mutex, where every writer holds it: a load and a store, no locked instruction.
  queued_count_.store(queued_count_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  lock.unlock();
  if (wake) queued_.notify_all();
  if (!async_op) work->wait();
  return work;
}

// A spent Op is reused (under the lock): allocating here and freeing on the progress thread
// would make the two threads contend for the allocator's lock on every call.
std::unique_ptr<ProcessGroup::Op> ProcessGroup::reuse_op(Op&& op) {
  if (spare_ops_.empty()) return std::make_unique<Op>(std::move(op));
  std::unique_ptr<Op> spare = std::move(spare_ops_.back());
  spare_ops_.pop_back();
  *spare = std::move(op);
  return spare;
}

void ProcessGroup::keep_spares(std::vector<std::unique_ptr<Op>>& spent) {
  for (std::unique_ptr<Op>& op : spent) {
    if (spare_ops_.size() >= kSpareOps) break;
    spare_ops_.push_back(std::move(op));
  }
  spent.clear();
}

// Note [Posted allreduces]
// In a burst of small asynchronous allreduces (a loss, a norm, a flag per layer) each call
// waits a round trip for its peers, and handing it to the progress thread costs more again:
// on a machine with as many busy threads as cores the two threads of a rank take turns on
// one. A backend that can split an allreduce (Backend::post_allreduce, e.g. shm's fast
// boxes) gets it posted instead: when nothing is queued or running, the issuing thread puts
// its data out at once, without waiting for the peers, and the Work stays pending in
// posted_. Finishing it (waiting for the peers' data and reducing it) is claimable: whoever
// waits on the Work finishes the posted ones up to it; the issuing thread finishes the oldest
// itself when max_posted() are outstanding; anything else to run (an inline operation, a
// claim, the progress thread's batch) finishes all posted ones first, so operations still
// complete in issue order; a call that reads the output of a posted one finishes that one
// before it posts, so it sees its result, as it would have queued behind it; and the progress
// thread finishes those nobody finished within kClaimWindow (it polls while any are posted: Note
// [Idle progress thread]). A rank's posts run ahead of its peers by up to max_posted() calls, so a
// burst costs one round trip in all rather than one per call. Not under LOOM_DEBUG (whose check
// runs each collective whole) nor for CUDA tensors.
WorkPtr ProcessGroup::post(Op&& op, const Tensor& input, Tensor& output, ReduceOp reduce) {
  const Clock::time_point issued = op_time();
  op.work = std::make_shared<Work>(op.label, op.timeout);
  std::unique_lock lock = lock_queue();
  if (!queue_.empty() || running_ || broken_) {
    lock.unlock();
    return submit(std::move(op), input, output, allreduce_body(reduce), /*async_op=*/true);
  }
  enter(op, static_cast<int64_t>(input.nbytes()), issued, /*starts=*/true);
  take_running();
  // Finished first: the oldest, when a post more would be too many, and every posted call
  // up to the last one whose output this call reads (it must see their results).
  size_t finish =
      posted_.size() >= backend_->max_posted() ? posted_.size() - backend_->max_posted() + 1 : 0;
  const ByteRange input_bytes = bytes_of(input);
  for (size_t i = finish; i < posted_.size(); ++i) {
    if (overlaps(posted_[i]->output_bytes, input_bytes)) finish = i + 1;
  }
  for (; finish > 0; --finish) {
    claimed_.push_back(std::move(posted_.front()));
    posted_.pop_front();
  }
  WorkPtr work = op.work;
  op.second = output;  // the input is read by the post, on this thread, and not kept
  op.output_bytes = bytes_of(output);
  switch (reduce) {  // capture-free bodies: see kFinishPosted
    case ReduceOp::Sum: op.body = kFinishPosted<ReduceOp::Sum>; break;
    case ReduceOp::Avg: op.body = kFinishPosted<ReduceOp::Avg>; break;
    case ReduceOp::Min: op.body = kFinishPosted<ReduceOp::Min>; break;
    case ReduceOp::Max: op.body = kFinishPosted<ReduceOp::Max>; break;
    case ReduceOp::Prod: op.body = kFinishPosted<ReduceOp::Prod>; break;
  }
  op.claimable = true;
  ++claimables_issued_;
  const bool wake = !progress_polling_;
  // Queued before it is posted: nobody else finishes it (or posts) while this thread runs.
  posted_.push_back(reuse_op(std::move(op)));
  Op& mine = *posted_.back();
  lock.unlock();
  work->offer_claim(this);
  Clock::time_point clock = issued;
  bool broke = run_in_order(claimed_, clock);
  if (!broke) {
    broke = run(
        mine,
        [&](Backend& backend, Deadline deadline) {
          backend.post_allreduce(input, reduce, deadline);
        },
        clock, /*finishes=*/false);
  }
  if (broke) {  // the post failed, or was not made after a finish failed
    lock.lock();
    if (!work->is_completed()) fail_unstarted(mine, op_time());
    mine.work = nullptr;
    claimed_.push_back(std::move(posted_.back()));
    posted_.pop_back();
    lock.unlock();
  }
  done_running_here();
  if (wake) queued_.notify_all();
  return work;
}

// Under the lock, with running_ clear: this thread now runs operations. The Ops the last
// thread to run some left spent in claimed_ go back to the spares.
void ProcessGroup::take_running() {
  // Relaxed: set under mutex_, where every reader looks (a locked instruction less per call).
  running_.store(true, std::memory_order_relaxed);
  keep_spares(claimed_);
}

// Runs `ops` in order on this thread, which holds running_; after one that breaks the group
// the rest fail unstarted. The spent Ops stay in `ops`, emptied, for keep_spares(). `clock`
// is when the first starts; each starts when the one before completed (one clock read per
// operation), and `clock` ends as the last one's completion.
bool ProcessGroup::run_in_order(std::vector<std::unique_ptr<Op>>& ops, Clock::time_point& clock) {
  size_t i = 0;
  bool broke = false;
  for (; i < ops.size() && !broke; ++i) {
    Op& op = *ops[i];
    if (!op.work) continue;  // spent: left by an earlier holder of running_
    if (op.claimable) op.work->withdraw_claim();
    broke = run(
        op,
        [&op](Backend& backend, Deadline deadline) {
          op.body(backend, deadline, op.first, op.second);
        },
        clock);
    op.work = nullptr;
  }
  if (i < ops.size()) {
    std::lock_guard lock(mutex_);
    for (; i < ops.size(); ++i) {
      if (ops[i]->work) fail_unstarted(*ops[i], op_time());
      ops[i]->work = nullptr;
    }
  }
  return broke;
}

// Runs operation `seq` on the calling thread when nothing runs and it is either posted (with
// the posted ones before it) or the queue's front (after every posted one).
bool ProcessGroup::claim(uint64_t seq) {
  std::unique_lock lock(mutex_);
  if (running_ || broken_) return false;
  const bool posted =
      !posted_.empty() && posted_.front()->label.seq <= seq && seq <= posted_.back()->label.seq;
  if (!posted && (queue_.empty() || queue_.front()->label.seq != seq)) return false;
  take_running();
  while (!posted_.empty() && (!posted || posted_.front()->label.seq <= seq)) {
    claimed_.push_back(std::move(posted_.front()));
    posted_.pop_front();
  }
  if (!posted) {
    claimed_.push_back(std::move(queue_.front()));
    queue_.pop_front();
    queued_count_.store(queued_count_.load(std::memory_order_relaxed) - 1,
                        std::memory_order_relaxed);
  }
  lock.unlock();
  Clock::time_point clock = op_time();
  run_in_order(claimed_, clock);
  done_running_here();
  return true;
}

// Only wakes the progress thread when another thread queued work meanwhile: a needless
// wake-up costs more than the whole small operation. running_ is atomic so that this check
// needs no lock (Note [Inline operations]).
void ProcessGroup::done_running_here() {
  running_.store(false, std::memory_order_release);
  if (queued_count_.load(std::memory_order_relaxed) > 0) {
    std::lock_guard relock(mutex_);
    queued_.notify_all();
  }
}

std::exception_ptr ProcessGroup::broken_error(const Op& op) const {
  std::string cause = "an earlier failure";
  try {
    std::rethrow_exception(broken_);
  } catch (const std::exception& e) {
    cause = e.what();
  }
  return std::make_exception_ptr(CommError(tag::kComm.prefix() + "rank " + std::to_string(rank_) +
                                               ": " + op.label.str() +
                                               " not started: the group is broken by " + cause,
                                           rank_));
}

// Note [Locking the queue]
// The issuing thread and the progress thread take mutex_ once per operation each, for a
// few hundred nanoseconds. When they collide, std::mutex puts the loser to sleep in the
// kernel, and the sleep and the wake-up cost microseconds each (more than a small
// operation): a burst of small asynchronous calls then runs at the speed of futex calls.
// The critical sections are short, so a thread that finds the lock taken retries for a
// moment (a few microseconds at most) before it sleeps.
std::unique_lock<std::mutex> ProcessGroup::lock_queue() {
  std::unique_lock lock(mutex_, std::try_to_lock);
  for (int i = 0; i < 200 && !lock.owns_lock(); ++i) {
    cpu_relax();
    lock.try_lock();
  }
  if (!lock.owns_lock()) lock.lock();
  return lock;
}

// Note [Batches]
// The progress thread takes everything queued in one go, under one lock, and runs it in
// order: a burst of small calls then costs the two threads one exchange of the queue per
// batch instead of one per operation (each exchange moves the lock's and the queue's cache
// lines between cores). running_ stays set for the whole batch, so calls issued meanwhile
// queue behind it; claim() finds its operation no longer queued and its waiter just waits.
// An operation that breaks the group fails the rest of its batch unstarted, as it would
// have failed them in the queue.
void ProcessGroup::progress_loop() {
  std::vector<std::unique_ptr<Op>> batch;
  std::chrono::microseconds poll_period = kClaimWindow;  // Note [Idle progress thread]
  uint64_t claimables_seen = 0;        // claimables_issued_ when this thread last looked
  size_t queued_seen = 0;  // the queue's length when this thread last looked behind a caller
  Clock::time_point last_claimable{};  // when a look last found new ones
  // Whether `op`'s claim window is over: kClaimWindow after this thread first saw it.
  auto window_over = [](Op& op, Clock::time_point now) {
    if (!op.seen_at) op.seen_at = now;
    return now >= *op.seen_at + kClaimWindow;
  };
  while (true) {
    {
      std::unique_lock lock = lock_queue();
      // A batch taken from a broken group fails here; one that ran is only spent.
      for (std::unique_ptr<Op>& op : batch) {
        if (op->work) fail_unstarted(*op, op_time());
        op->work = nullptr;
      }
      keep_spares(batch);
      // Something to run (or the order to stop), and no operation running on a caller's
      // thread: queued operations, or a posted allreduce nobody finished within kClaimWindow.
      auto may_proceed = [&](Clock::time_point now) {
        return !running_ && (stopping_ || !queue_.empty() ||
                             (!posted_.empty() && window_over(*posted_.front(), now)));
      };
      for (Clock::time_point now = Clock::now(); !may_proceed(now); now = Clock::now()) {
        if (claimables_issued_ != claimables_seen) {
          claimables_seen = claimables_issued_;
          last_claimable = now;
        }
        // Work queued behind an operation on a caller's thread keeps it polling, as its
        // notification can be lost (Note [Inline operations]); from kClaimWindow when more came.
        const bool behind_caller = running_ && !queue_.empty();
        if (behind_caller && queue_.size() != queued_seen) poll_period = kClaimWindow;
        queued_seen = behind_caller ? queue_.size() : 0;
        // Posted allreduces keep it polling: a thread that finishes one does not wake it.
        progress_polling_ =
            behind_caller || !posted_.empty() || now < last_claimable + kIdlePollSpan;
        if (progress_polling_) {
          // A posted allreduce seen at an earlier look starts once its window is over; one
          // first seen now waits a whole period, so that a burst (whose oldest posted call
          // changes at every look) still costs one wake-up per period, not per kClaimWindow.
          Clock::time_point wake = now + poll_period;
          if (!posted_.empty() && posted_.front()->seen_at && *posted_.front()->seen_at < now)
            wake = std::min(wake, *posted_.front()->seen_at + kClaimWindow);
          queued_.wait_until(lock, wake);
          poll_period = std::min(2 * poll_period, kLongestPoll);
        } else {
          queued_.wait(lock);
        }
      }
      progress_polling_ = false;
      poll_period = kClaimWindow;
      if (queue_.empty() && posted_.empty()) return;
      // A claimable operation alone in the queue is left to its waiter for a moment.
      if (posted_.empty()) {
        Op& front = *queue_.front();
        if (front.claimable && queue_.size() == 1 && !stopping_ &&
            !window_over(front, Clock::now())) {
          queued_.wait_until(lock, *front.seen_at + kClaimWindow);
          continue;
        }
      }
      // Posted allreduces first: every operation in the queue was issued after them.
      for (std::deque<std::unique_ptr<Op>>* from : {&posted_, &queue_}) {
        for (std::unique_ptr<Op>& op : *from)
          batch.push_back(std::move(op));
        from->clear();
      }
      queued_count_.store(0, std::memory_order_relaxed);
      if (broken_) continue;  // the batch fails unstarted at the top of the loop
      running_.store(true, std::memory_order_relaxed);  // as in take_running()
    }
    Clock::time_point clock = op_time();
    run_in_order(batch, clock);
    running_.store(false);
  }
}

void ProcessGroup::fail_unstarted(Op& op, Clock::time_point now) {
  op.drop_inputs();
  flight_->completed(op.label.seq, now, "not started: the group is broken");
  op.work->complete(broken_error(op), now);
}

// Runs one operation on the current thread, starting at `clock`, which ends as its completion
// time; the caller holds the running_ flag. Returns true when the operation broke the group.
template <typename Body>
bool ProcessGroup::run(Op& op, Body&& body, Clock::time_point& clock, bool finishes) {
  const Clock::time_point start = clock;
  // `start` may be the coarse clock's, up to coarse_clock_lag() behind (Note [Operation times]).
  const Deadline deadline = start + coarse_clock_lag() + op.timeout;
  op.work->mark_started(start);
  if (!op.flight_started) {  // (an inline or posted operation's record has its start)
    op.flight_started = true;
    flight_->started(op.label.seq, start);
  }
  std::exception_ptr error;
  bool broke = false;
  std::string failure;  // the recorder's note of a failed operation
  try {
    if (options_.debug_checks && op.collective) {  // (never posted: Note [Posted allreduces])
      check_same_collective(*store_, name_, rank_, size_, op.label.seq, op.signature, op.timeout);
    }
    Backend& backend = op.staged ? *staged_ : *backend_;
    if (op.stream.device >= 0) {
      IssueStreamScope scope(op.stream);
      body(backend, deadline);
    } else {
      body(backend, deadline);
    }
  } catch (const CommError& e) {
    error = std::make_exception_ptr(e.rephrased(std::string(e.what()) + " (" + op.label.str() +
                                                ", timeout " + duration_str(op.timeout) + ")"));
    {
      std::lock_guard lock(mutex_);
      broken_ = error;
    }
    broke = true;
    flight_->completed(op.label.seq, op_time(), e.what());
    FlightRecorder::global().dump_if_configured(rank_);  // what this rank was doing
  } catch (const std::exception& e) {
    error = std::current_exception();
    failure = e.what();
  } catch (...) {
    error = std::current_exception();
    failure = "unknown exception";
  }
  if (!finishes && !error) return false;  // posted: complete once finished
  Clock::time_point done = op_time();
  if (runs_at_issue_ && !error) {  // its simulated interval
    const Backend::Times times = backend_->last_times();
    op.work->mark_started(times.started);
    done = times.completed;
  }
  clock = done;
  if (!failure.empty()) {
    flight_->completed(op.label.seq, done, failure);
  } else if (!error) {
    flight_->completed(op.label.seq, done);
  }
  op.drop_inputs();
  op.work->complete(error, done);
  return broke;
}

}  // namespace loom::comm
