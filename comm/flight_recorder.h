#pragma once
// The flight recorder (PyTorch's idea, for NCCL): every process keeps the last
// kFlightCapacity operations of each of its process groups, with their state (queued,
// started, completed, failed) and times, so that a hung or failed job can say what each rank
// was doing. With LOOM_FLIGHT_RECORDER_DIR set, each rank writes them to
// DIR/flight.rank-<RANK>.json when an operation fails (a CommError: a dead peer, a timeout)
// and when it receives SIGUSR1; `loom-trace analyze DIR` merges the files and names the
// first operation the ranks disagree on or that some rank never reached
// (tools/loom_trace/analyze.h).
//
// Threading: every function is thread-safe, except that a Log's records come from one thread
// at a time (its group's queue lock); records and their updates take no lock.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/work.h"

namespace loom::comm {

// Per process group; a power of two (an entry's slot is its sequence number's low bits).
inline constexpr size_t kFlightCapacity = 2048;
static_assert((kFlightCapacity & (kFlightCapacity - 1)) == 0);
// Logs of destroyed groups kept for dumps (FlightRecorder::close_group).
inline constexpr size_t kClosedFlightLogs = 8;

class FlightRecorder {
 public:
  class Log;

  // The process's recorder. Its creation reads LOOM_FLIGHT_RECORDER: loom::Error for a value
  // other than 0 or 1 (ProcessGroup's construction asks first, on the constructing thread).
  static FlightRecorder& global();

  // False when LOOM_FLIGHT_RECORDER=0: logs then keep nothing (for measuring their cost).
  bool enabled() const { return enabled_; }
  // A new process group's log (at its construction).
  Log& register_group(const std::string& name, int group_rank, int group_size);
  // At the group's destruction, once nothing updates its log any more. The logs of the last
  // kClosedFlightLogs groups closed stay in dumps (a job that failed may have destroyed the
  // group that failed); older ones are freed, so that a program that makes and destroys
  // groups all along does not grow by a ring per group.
  void close_group(Log& log);

  // {"rank": R, "entries": [{"group", "group_rank", "group_size", "seq", "op", "bytes",
  // "dtype", "peer", "state", "queued_us", "started_us", "completed_us", "error"}, ...]},
  // group by group (in their order of creation), each oldest first; times are microseconds
  // of the steady clock.
  std::string json(int rank) const;
  // Writes json() to `path` (atomically: a temporary file renamed).
  void dump(const std::filesystem::path& path, int rank) const;
  // When LOOM_FLIGHT_RECORDER_DIR is set: dumps to DIR/flight.rank-<rank>.json, where rank
  // is the job's RANK when set, else `fallback_rank`. Never throws (it runs on error paths).
  void dump_if_configured(int fallback_rank) const noexcept;
  // With LOOM_FLIGHT_RECORDER_DIR set, SIGUSR1 dumps (a watcher thread does the writing).
  // Idempotent.
  static void install_signal_dump();
  // Start-up check of LOOM_FLIGHT_RECORDER_DIR (when set): creates the directory and makes
  // sure this process may write there, so that a bad value is an error now, naming the
  // variable, not a dump silently lost when a collective fails. Throws loom::Error.
  static void check_dump_directory();
  // The rank dumps are named after when RANK is not set: the first process group's rank
  // (the world's, as a rank creates it first). Later calls change nothing.
  void note_rank(int rank);

 private:
  FlightRecorder();

  mutable std::mutex mutex_;       // logs_, closed_, rank_, and the logs' error texts
  std::list<Log> logs_;            // in order of creation (a Log never moves once handed out)
  std::deque<const Log*> closed_;  // closed logs still kept, oldest first
  int rank_ = -1;
  bool enabled_ = true;
};

// One process group's operations, in its issue order: the last kFlightCapacity of them.
class FlightRecorder::Log {
 public:
  Log(FlightRecorder& recorder, std::string name, int rank, int size);

  // A new entry for operation `label.seq`, just issued. Sequence numbers come in increasing
  // order, from one thread at a time (the group numbers and records an operation under its
  // queue's lock). The times are the caller's: a group reads the clock once per phase of an
  // operation and gives the same time to its Work and to the log. `started`: the operation
  // also starts now (it runs on the issuing thread), which saves the started() call.
  void record(const OpLabel& label, std::chrono::steady_clock::time_point when,
              bool started = false);
  // Updates of operation `seq`'s entry, from any thread (nothing once kFlightCapacity later
  // operations took its slot).
  void started(uint64_t seq, std::chrono::steady_clock::time_point when);
  // `error`: empty for success, else the failure (copied).
  void completed(uint64_t seq, std::chrono::steady_clock::time_point when,
                 std::string_view error = {});

 private:
  friend class FlightRecorder;  // json()
  // Every issued operation records an entry, so record() takes no lock: it fills its slot
  // as a seqlock writer (Note [Lock-free records] in flight_recorder.cpp). Every field is an
  // atomic, read by json() only while the slot's id stays the same. An entry is one cache
  // line, written on every small call: Note [A line per record].
  enum State : uint8_t { kQueued, kStarted, kCompleted, kFailed };
  struct alignas(64) Entry {
    std::atomic<uint64_t> id{0};  // seq + 1; 0 while being (re)filled
    std::atomic<uint64_t> bytes{0};
    std::atomic<const char*> kind{nullptr}, dtype{nullptr};  // OpLabel's, static storage
    std::atomic<int64_t> queued_us{0}, started_us{-1}, completed_us{-1};
    std::atomic<int32_t> peer{-1};
    std::atomic<uint8_t> kind_length{0}, dtype_length{0};  // (names are short)
    std::atomic<uint8_t> state{kQueued};
    std::atomic<bool> has_error{false};  // errors_ holds its text; both change under the mutex
  };
  static_assert(sizeof(Entry) == 64);
  Entry* find(uint64_t seq);
  // The error texts, under the recorder's mutex (out of line: failures only).
  void forget_error(uint64_t seq);
  void keep_error(uint64_t seq, std::string_view error);
  static int64_t us_of(std::chrono::steady_clock::time_point when) {
    return std::chrono::duration_cast<std::chrono::microseconds>(when.time_since_epoch()).count();
  }

  FlightRecorder& recorder_;
  const std::string name_;
  const int rank_, size_;
  const bool enabled_;
  std::unique_ptr<Entry[]> entries_;
  std::map<uint64_t, std::string> errors_;  // by seq, under the recorder's mutex
};

// Inline: every operation records an entry and updates it (Note [A line per record] in
// flight_recorder.cpp).
inline void FlightRecorder::Log::record(const OpLabel& label,
                                        std::chrono::steady_clock::time_point when, bool started) {
  if (!enabled_) return;
  Entry& e = entries_[label.seq & (kFlightCapacity - 1)];
  constexpr auto relaxed = std::memory_order_relaxed;
  const uint64_t previous = e.id.load(relaxed);
  e.id.store(0, relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // the 0 is seen before new fields
  if (e.has_error.load(relaxed)) {                      // (set only in an entry that had an id)
    forget_error(previous - 1);
    e.has_error.store(false, relaxed);
  }
  e.bytes.store(label.bytes, relaxed);
  e.kind.store(label.kind.data(), relaxed);
  e.kind_length.store(static_cast<uint8_t>(std::min<size_t>(label.kind.size(), 255)), relaxed);
  e.dtype.store(label.dtype.data(), relaxed);
  e.dtype_length.store(static_cast<uint8_t>(std::min<size_t>(label.dtype.size(), 255)), relaxed);
  e.peer.store(label.peer, relaxed);
  const int64_t at = us_of(when);
  e.state.store(started ? kStarted : kQueued, relaxed);
  e.queued_us.store(at, relaxed);
  e.started_us.store(started ? at : -1, relaxed);
  e.completed_us.store(-1, relaxed);
  e.id.store(label.seq + 1, std::memory_order_release);
}

inline FlightRecorder::Log::Entry* FlightRecorder::Log::find(uint64_t seq) {
  if (!enabled_) return nullptr;
  Entry& e = entries_[seq & (kFlightCapacity - 1)];
  // Overwritten by a newer operation (kFlightCapacity later): nothing to update.
  return e.id.load(std::memory_order_acquire) == seq + 1 ? &e : nullptr;
}

inline void FlightRecorder::Log::started(uint64_t seq, std::chrono::steady_clock::time_point when) {
  if (Entry* e = find(seq)) {
    e->started_us.store(us_of(when), std::memory_order_relaxed);
    e->state.store(kStarted, std::memory_order_release);
  }
}

inline void FlightRecorder::Log::completed(uint64_t seq, std::chrono::steady_clock::time_point when,
                                           std::string_view error) {
  Entry* e = find(seq);
  if (e == nullptr) return;
  if (!error.empty()) {
    keep_error(seq, error);
    e->has_error.store(true, std::memory_order_relaxed);
  }
  e->completed_us.store(us_of(when), std::memory_order_relaxed);
  e->state.store(error.empty() ? kCompleted : kFailed, std::memory_order_release);
}

}  // namespace loom::comm
