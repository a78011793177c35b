#pragma once
// Work: the handle of one asynchronous operation. The process group's progress thread
// completes it, with an error when the operation failed; wait() blocks (never longer than
// its timeout) and rethrows that error.

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "comm/error.h"

namespace loom::comm {

// What an operation is, for messages: "allreduce #12, 4 MiB f32", "send #3, 8 B u8 to rank 1".
// Kept as parts and formatted only when a message needs it (small calls stay cheap).
struct OpLabel {
  std::string_view kind;  // a string with static storage: "allreduce"
  uint64_t seq = 0;       // position in the group's issue order
  size_t bytes = 0;
  std::string_view dtype;  // static too: "f32"
  int peer = -1;           // send/recv: the other rank
  bool to_peer = false;    // send (true) or recv (false)
  std::string str() const;
};

// Runs a queued operation on the thread that waits for it (Note [Claimable operations] in
// process_group.cpp): the process group.
class Claimer {
 public:
  // Runs operation `seq` on the calling thread and returns true, or returns false (it
  // started elsewhere).
  virtual bool claim(uint64_t seq) = 0;

 protected:
  ~Claimer() = default;
};

class Work {
 public:
  explicit Work(const OpLabel& label, Duration default_timeout = kDefaultTimeout)
      : label_(label), default_timeout_(default_timeout) {}

  // Blocks until the operation finished, then rethrows its error if it failed. With a
  // `timeout`, throws loom::CommError when it passes first. Without one, waits while the
  // operation is queued behind others (each of which is bounded by its own timeout) and at
  // most the operation's timeout (plus a second of grace) once it has started.
  // Thread-safe; may be called any number of times.
  // (Two overloads, not a std::optional argument: an optional built at the call is stored in
  // parts and loaded whole, a failed store forward on every small call.)
  void wait() { wait_until_done(nullptr); }
  void wait(Duration timeout) { wait_until_done(&timeout); }
  bool is_completed() const { return completed_.load(); }
  // The error of a failed operation (null while running or after success).
  std::exception_ptr exception() const;
  std::string description() const { return label_.str(); }

  // When the operation started, and completed, on the thread that ran it: for traces that
  // show communication as it happened. Empty until then (started_at: or when it never ran).
  // The coarse clock's times (a timer tick, 1 to 4 ms) unless the group times precisely
  // (GroupOptions::precise_times, LOOM_COMM_TIMING=1: Note [Operation times]).
  std::optional<Clock::time_point> started_at() const;
  std::optional<Clock::time_point> completed_at() const;

  // The group numbers an operation under its queue's lock, after making its Work outside
  // it; no other thread sees the Work before.
  void set_seq(uint64_t seq) { label_.seq = seq; }
  // Called by the thread that runs the operation: once when it starts, once when it ends.
  // (Inline: a small call runs both, and is_completed(), once each; Note [Work completion].)
  void mark_started(Clock::time_point when = Clock::now()) {
    // Relaxed: only wait()'s timeout reads it, and a late view only delays that by a slice.
    started_.store(std::max<Clock::rep>(when.time_since_epoch().count(), 1),
                   std::memory_order_relaxed);
  }
  void complete(std::exception_ptr error = nullptr, Clock::time_point when = Clock::now()) {
    completed_at_.store(std::max<Clock::rep>(when.time_since_epoch().count(), 1),
                        std::memory_order_relaxed);  // published by completed_ below
    error_ = std::move(error);
    completed_.store(true);
    if (waiters_.load() > 0) wake_waiters();
  }

  // The process group's offer to run a queued operation on the thread that waits for it
  // (Note [Claimable operations] in process_group.cpp): wait() first calls
  // claimer->claim(seq), once. The group withdraws the offer before another thread starts
  // the operation. Atomic stores: no lock per call.
  void offer_claim(Claimer* claimer) { claimer_.store(claimer, std::memory_order_release); }
  void withdraw_claim() { claimer_.store(nullptr, std::memory_order_relaxed); }

 private:
  void wake_waiters();                            // complete()'s, when a thread sleeps in wait()
  void wait_until_done(const Duration* timeout);  // null: the default bound (wait())

  // A Work is allocated per call, and small calls cost a few hundred nanoseconds: it stays
  // within glibc's fast bins (at most 128 bytes with make_shared's control block).
  OpLabel label_;
  Duration default_timeout_;
  // Completion is published through atomics so that an operation nobody is waiting for yet
  // (the common case for small calls) completes without taking a lock; a thread that blocks
  // in wait() sleeps on a mutex and condition variable shared by a stripe of Works (Note
  // [Waiting stripes]). See Note [Work completion].
  std::atomic<bool> completed_{false};
  std::atomic<int> waiters_{0};
  std::atomic<Clock::rep> started_{0};  // time_since_epoch of the start; 0: not started
  std::atomic<Clock::rep> completed_at_{0};  // likewise, of the completion
  std::exception_ptr error_;            // written before completed_ is set
  std::atomic<Claimer*> claimer_{nullptr};  // offer_claim()
};

using WorkPtr = std::shared_ptr<Work>;

// Sees the calling thread's simulated operations issued and every wait() on a Work before it
// blocks: the simulation's clock (sim/timeline.h), for which a wait is where a rank's compute
// stream meets an operation's completion. Installed per thread (one simulated rank per
// thread), only while a simulation runs.
class WaitObserver {
 public:
  // A Work of a group whose operations run at issue (Backend::runs_at_issue), right after its
  // operation ran on this thread, before anything waits for it.
  virtual void issued(const Work&) {}
  virtual void waiting(const Work& work) = 0;

 protected:
  ~WaitObserver() = default;
};

// Installs `observer` (not owned; null: none) for the calling thread and returns its previous
// one; wait_observer() is the calling thread's.
WaitObserver* set_wait_observer(WaitObserver* observer);
WaitObserver* wait_observer();

}  // namespace loom::comm
