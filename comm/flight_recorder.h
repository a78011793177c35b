#pragma once
// The flight recorder (PyTorch's idea, for NCCL): every process keeps the last
// kFlightCapacity operations of all its process groups, with their state (queued, started,
// completed, failed) and times, so that a hung or failed job can say what each rank was
// doing. With LOOM_FLIGHT_RECORDER_DIR set, each rank writes them to
// DIR/flight.rank-<RANK>.json when an operation fails (a CommError: a dead peer, a timeout)
// and when it receives SIGUSR1; `loom-trace analyze DIR` merges the files and names the
// first operation the ranks disagree on or that some rank never reached
// (tools/loom_trace/analyze.h).
//
// Threading: every function is thread-safe; record() and its updates take no lock.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/work.h"

namespace loom::comm {

inline constexpr size_t kFlightCapacity = 4096;

class FlightRecorder {
 public:
  // The process's recorder. Its creation reads LOOM_FLIGHT_RECORDER: loom::Error for a value
  // other than 0 or 1 (ProcessGroup's construction asks first, on the constructing thread).
  static FlightRecorder& global();

  // False when LOOM_FLIGHT_RECORDER=0: record() then keeps nothing (for measuring its cost).
  bool enabled() const { return enabled_; }
  // A process group's name, once (at its construction): the id its records carry.
  uint32_t register_group(const std::string& name, int group_rank, int group_size);
  // A new entry for an operation just issued; returns its id for the updates below (0 when
  // disabled; the updates ignore it).
  // The times are the caller's: a group reads the clock once per phase of an operation and
  // gives the same time to its Work and to the recorder.
  // `started`: the operation also starts now (it runs on the issuing thread), which saves the
  // started() call.
  uint64_t record(uint32_t group, const OpLabel& label, std::chrono::steady_clock::time_point when,
                  bool started = false);
  // `when`: the start time the caller already read (a clock read costs as much as the rest).
  void started(uint64_t id, std::chrono::steady_clock::time_point when);
  // `error`: empty for success, else the failure (copied).
  void completed(uint64_t id, std::chrono::steady_clock::time_point when,
                 std::string_view error = {});

  // {"rank": R, "entries": [{"group", "group_rank", "group_size", "seq", "op", "bytes",
  // "dtype", "peer", "state", "queued_us", "started_us", "completed_us", "error"}, ...]},
  // oldest first; times are microseconds of the steady clock.
  std::string json(int rank) const;
  // Writes json() to `path` (atomically: a temporary file renamed).
  void dump(const std::filesystem::path& path, int rank) const;
  // When LOOM_FLIGHT_RECORDER_DIR is set: dumps to DIR/flight.rank-<rank>.json, where rank
  // is the job's RANK when set, else `fallback_rank`. Never throws (it runs on error paths).
  void dump_if_configured(int fallback_rank) const noexcept;
  // With LOOM_FLIGHT_RECORDER_DIR set, SIGUSR1 dumps (a watcher thread does the writing).
  // Idempotent.
  static void install_signal_dump();
  // The rank dumps are named after when RANK is not set: the first process group's rank
  // (the world's, as a rank creates it first). Later calls change nothing.
  void note_rank(int rank);

 private:
  struct Group {
    std::string name;
    int rank = 0, size = 0;
  };
  // Every issued operation records an entry, so record() takes no lock: it claims a slot by
  // its id and fills it as a seqlock writer (Note [Lock-free records] in
  // flight_recorder.cpp). Every field is an atomic, read by json() only while the slot's id
  // stays the same. started() and completed() update the times and state in place.
  enum State : uint8_t { kQueued, kStarted, kCompleted, kFailed };
  struct Entry {
    std::atomic<uint64_t> id{0};                             // 0 while being (re)filled
    std::atomic<uint32_t> group{0};                          // index into groups_
    std::atomic<const char*> kind{nullptr}, dtype{nullptr};  // OpLabel's, static storage
    std::atomic<uint32_t> kind_length{0}, dtype_length{0};
    std::atomic<uint64_t> seq{0}, bytes{0};
    std::atomic<int32_t> peer{-1};
    std::atomic<uint8_t> state{kQueued};
    std::atomic<int64_t> queued_us{0}, started_us{-1}, completed_us{-1};
    std::atomic<bool> has_error{false};  // error below is set; both change under mutex_
    std::string error;                   // failures only
  };
  Entry* find(uint64_t id);

  mutable std::mutex mutex_;  // groups_, rank_, and the entries' errors
  std::vector<Entry> ring_ = std::vector<Entry>(kFlightCapacity);
  std::vector<Group> groups_;
  std::atomic<uint64_t> next_id_{1};
  int rank_ = -1;
  bool enabled_ = true;

  FlightRecorder();
};

}  // namespace loom::comm
