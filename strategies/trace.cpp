#include "strategies/trace.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies {

namespace {
std::atomic<Trace*> g_current{nullptr};
}  // namespace

Trace* current_trace() {
  return g_current.load(std::memory_order_acquire);
}

void set_current_trace(Trace* trace) {
  g_current.store(trace, std::memory_order_release);
}

std::string trace_path_for_rank(const std::string& path, int rank, int world) {
  if (world <= 1) return path;
  size_t slash = path.find_last_of('/');
  size_t dot = path.find_last_of('.');
  std::string suffix = ".rank" + std::to_string(rank);
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == 0 ||
      dot == slash + 1) {
    return path + suffix;
  }
  return path.substr(0, dot) + suffix + path.substr(dot);
}

Trace::Trace()
    : epoch_(Clock::now()), thread_names_{{kMainThread, "main"}, {kCommThread, "comm"}} {}

int64_t Trace::to_us(Clock::time_point t) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(t - epoch_).count();
}

int64_t Trace::now_us() const {
  return to_us(Clock::now());
}

void Trace::complete(std::string name, std::string category, int64_t start_us, int64_t duration_us,
                     int tid, Args args) {
  std::lock_guard lock(mutex_);
  events_.push_back({'X', std::move(name), std::move(category), start_us,
                     std::max<int64_t>(duration_us, 0), tid, std::move(args)});
}

void Trace::instant(std::string name, std::string category, int64_t at_us, int tid, Args args) {
  std::lock_guard lock(mutex_);
  events_.push_back({'i', std::move(name), std::move(category), at_us, 0, tid, std::move(args)});
}

void Trace::set_thread_name(int tid, std::string name) {
  std::lock_guard lock(mutex_);
  thread_names_[tid] = std::move(name);
}

size_t Trace::event_count() const {
  std::lock_guard lock(mutex_);
  return events_.size();
}

std::vector<Trace::Event> Trace::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

void Trace::write(const std::string& path, int rank) const { write_ranks(path, {{rank, this}}); }

void Trace::write_ranks(const std::string& path,
                        const std::vector<std::pair<int, const Trace*>>& ranks) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [rank, trace] : ranks) {
    std::vector<Event> events;
    std::map<int, std::string> names;
    {
      std::lock_guard lock(trace->mutex_);
      events = trace->events_;
      names = trace->thread_names_;
    }
    // Enclosing spans first at equal start times, so that viewers nest them.
    std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
      return a.ts != b.ts ? a.ts < b.ts : a.dur > b.dur;
    });
    list.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", rank},
                    {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
    for (const auto& [tid, name] : names) {
      list.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", rank},
                      {"tid", tid},
                      {"args", {{"name", name}}}});
      list.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", rank},
                      {"tid", tid},
                      {"args", {{"sort_index", tid}}}});
    }
    for (const Event& e : events) {
      nlohmann::json j = {{"ph", std::string(1, e.phase)},
                          {"name", e.name},
                          {"cat", e.category},
                          {"pid", rank},
                          {"tid", e.tid},
                          {"ts", e.ts}};
      if (e.phase == 'X') j["dur"] = e.dur;
      if (e.phase == 'i') j["s"] = "t";
      if (!e.args.empty()) {
        nlohmann::json args = nlohmann::json::object();
        for (const auto& [key, value] : e.args)
          args[key] = value;
        j["args"] = std::move(args);
      }
      list.push_back(std::move(j));
    }
  }
  nlohmann::json doc = {{"traceEvents", std::move(list)}, {"displayTimeUnit", "ms"}};
  write_file_atomically(path, doc.dump() + "\n", tag::kTrace);
}

Trace::Span::Span(Trace* trace, std::string name, std::string category, int tid, Args args)
    : trace_(trace), tid_(tid) {
  if (trace_ == nullptr) return;
  name_ = std::move(name);
  category_ = std::move(category);
  args_ = std::move(args);
  start_us_ = trace_->now_us();
}

Trace::Span::~Span() {
  if (trace_ == nullptr) return;
  trace_->complete(std::move(name_), std::move(category_), start_us_, trace_->now_us() - start_us_,
                   tid_, std::move(args_));
}

std::optional<ClockSpan> measured_span(const comm::Work& work) {
  const auto started = work.started_at(), completed = work.completed_at();
  if (!started || !completed) return std::nullopt;
  return ClockSpan{*started, *completed};
}

// See Note [Communication spans in the trace].
void record_comm_span(Trace& trace, CommLanes& lanes, std::string name, std::string category,
                      int64_t issued_us, int64_t known_done_us,
                      const std::optional<ClockSpan>& measured, Trace::Args args) {
  int64_t start = issued_us, end = known_done_us;
  if (measured) {
    start = std::max(trace.to_us(measured->first), issued_us);
    end = std::max(trace.to_us(measured->second), start);
    args.emplace_back("queued_us", start - issued_us);
  }
  const int tid = lanes.row_for(trace, start, end);
  trace.complete(std::move(name), std::move(category), start, end - start, tid, std::move(args));
}

int CommLanes::row_for(Trace& trace, int64_t start_us, int64_t end_us) {
  size_t lane = 0;
  while (lane < free_at_.size() && free_at_[lane] > start_us)
    ++lane;
  if (lane == free_at_.size()) free_at_.push_back(0);
  free_at_[lane] = end_us;
  const int tid = Trace::kCommThread + static_cast<int>(lane);
  if (lane > 0) trace.set_thread_name(tid, "comm " + std::to_string(lane + 1));
  return tid;
}

}  // namespace loom::strategies
