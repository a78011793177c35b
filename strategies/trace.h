#pragma once
// A timeline recorder for training runs, written as Chrome trace JSON (chrome://tracing,
// ui.perfetto.dev): one process per rank, one row per thread (0 = main, 1 = comm, more
// comm lanes when several buckets are in flight at once).
//
//   Trace trace;
//   set_current_trace(&trace);            // library code records only while one is set
//   { Trace::Span s(current_trace(), "forward", "step"); ... }
//   trace.write("trace.json", rank);      // {"traceEvents": [...], "displayTimeUnit": "ms"}
//
// Times are microseconds since the Trace's construction (steady_clock). Every method may be
// called from any thread. With no current trace, instrumented code costs one pointer check.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/work.h"

namespace loom::strategies {

class Trace {
 public:
  using Clock = std::chrono::steady_clock;
  using Args = std::vector<std::pair<std::string, int64_t>>;
  static constexpr int kMainThread = 0;
  static constexpr int kCommThread = 1;

  Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // Microseconds since this trace's epoch.
  int64_t now_us() const;
  int64_t to_us(Clock::time_point t) const;

  // A complete ("X") event: [start_us, start_us + duration_us) on row `tid`.
  void complete(std::string name, std::string category, int64_t start_us, int64_t duration_us,
                int tid = kMainThread, Args args = {});
  // An instant ("i") event at at_us on row `tid`.
  void instant(std::string name, std::string category, int64_t at_us, int tid = kMainThread,
               Args args = {});
  // Names row `tid` in the viewer; rows 0 and 1 are "main" and "comm" unless renamed.
  void set_thread_name(int tid, std::string name);

  struct Event {
    char phase;  // 'X' or 'i'
    std::string name, category;
    int64_t ts, dur;  // microseconds; dur is 0 for instants
    int tid;
    Args args;
  };
  size_t event_count() const;
  // A copy of the events recorded so far, in recording order (for reports that sum spans).
  std::vector<Event> events() const;

  // Writes the Chrome JSON object format with pid = rank; events sorted by start time,
  // metadata ("M") events first. Atomic: a temporary file next to `path`, then rename.
  // Throws loom::Error when the file cannot be written.
  void write(const std::string& path, int rank) const;
  // The same for several ranks' traces in one file (a process each, pid = rank; a simulated
  // pipeline's stages).
  static void write_ranks(const std::string& path,
                          const std::vector<std::pair<int, const Trace*>>& ranks);

  // Records [construction, destruction) as a complete event; a null trace records nothing.
  class Span {
   public:
    Span(Trace* trace, std::string name, std::string category, int tid = kMainThread,
         Args args = {});
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    Trace* trace_;
    std::string name_, category_;
    int tid_;
    Args args_;
    int64_t start_us_ = 0;
  };

 private:
  Clock::time_point epoch_;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::map<int, std::string> thread_names_;
};

// Rows for communication spans that may overlap (buckets or units in flight together): a
// span goes to the first comm row whose last span ended by its start ("comm", then
// "comm 2", ...), so that viewers never see improperly nested slices on one row. Record
// spans in the order they end.
class CommLanes {
 public:
  // The row (a Trace tid) for [start_us, end_us); names new rows in `trace`.
  int row_for(Trace& trace, int64_t start_us, int64_t end_us);

 private:
  std::vector<int64_t> free_at_;  // per row: when its last span ended
};

// Note [Communication spans in the trace]
// A collective's span on the comm rows runs from the moment it really started to the moment it
// really finished, as the process group's progress thread recorded them (comm::Work's
// started_at / completed_at; a group times its operations precisely once asked to,
// ProcessGroup::time_precisely, which instrumented code does while a trace records), with the
// time it waited in the group's queue after being issued as `queued_us`. Where that is not
// known (a DDP comm hook that runs several operations per bucket), the span runs from issue to
// `known_done_us`, the moment the training thread learned it had finished: an upper bound.
// DDP's buckets and the sharding engine's all-gathers and reductions are recorded this way.
using ClockSpan = std::pair<Clock::time_point, Clock::time_point>;
// When `work` really started and finished, once it completed; empty before, or where its group
// did not record it.
std::optional<ClockSpan> measured_span(const comm::Work& work);
void record_comm_span(Trace& trace, CommLanes& lanes, std::string name, std::string category,
                      int64_t issued_us, int64_t known_done_us,
                      const std::optional<ClockSpan>& measured, Trace::Args args);

// The process-wide trace that instrumented library code (the DDP reducer, train_gpt's loop)
// records into; null (the default) turns recording off. The caller owns the Trace and must
// reset the pointer before destroying it.
Trace* current_trace();
void set_current_trace(Trace* trace);

// "trace.json" -> "trace.rank1.json" (suffix before the extension) when world > 1.
std::string trace_path_for_rank(const std::string& path, int rank, int world);

}  // namespace loom::strategies
