#include "comm/flight_recorder.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>

#include "core/tags.h"
#include "core/tunables.h"
namespace loom::comm {

namespace {

int64_t us_of(std::chrono::steady_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::microseconds>(when.time_since_epoch()).count();
}

// An OpLabel's string_view as kept in an entry (an empty one may have no pointer).
std::string text_of(const char* data, uint32_t size) {
  return size == 0 ? std::string() : std::string(data, size);
}

const char* state_name(int state) {
  static const char* names[] = {"queued", "started", "completed", "failed"};
  return names[state];
}

int job_rank(int noted, int fallback) {
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && *rank != '\0') return std::atoi(rank);
  return noted >= 0 ? noted : fallback;
}

// LOOM_FLIGHT_RECORDER: unset, empty or 1 records, 0 does not. Any other value is loom::Error
// rather than ignored, so that a job never runs without the recorder it was thought to have.
bool enabled_by_environment() {
  const char* setting = tunable_value(tunables::kFlightRecorder);
  if (setting == nullptr || *setting == '\0') return true;
  const std::string_view value(setting);
  if (value == "1") return true;
  if (value == "0") return false;
  tag::kComm.fail(tunables::kFlightRecorder.name, "='", setting,
                  "' is not a known setting; expected 1 (record, the default) or 0 (off)");
}

int signal_pipe[2] = {-1, -1};

void on_sigusr1(int) {
  const char byte = 1;
  (void)!::write(signal_pipe[1], &byte, 1);  // async-signal-safe; the watcher dumps
}

}  // namespace

FlightRecorder::FlightRecorder() : enabled_(enabled_by_environment()) {}

FlightRecorder& FlightRecorder::global() {
  static FlightRecorder* recorder = new FlightRecorder();  // outlives every group's threads
  return *recorder;
}

uint32_t FlightRecorder::register_group(const std::string& name, int group_rank,
                                        int group_size) {
  std::lock_guard lock(mutex_);
  groups_.push_back({name, group_rank, group_size});
  return static_cast<uint32_t>(groups_.size() - 1);
}

// Note [Lock-free records]
// record() runs on every operation's issue path, where a lock costs a tenth of a small
// call, so an entry is a seqlock: the writer takes a fresh id (the ids of the ring's slot
// grow by kFlightCapacity), clears the slot's id, fills every field with relaxed stores and
// publishes the id with a release store. json() reads the id (acquire), the fields, then the
// id again after an acquire fence, and drops the entry if the id changed meanwhile (a
// writer 4096 operations later took the slot). Every field is an atomic, so a torn read is
// detected, never undefined. Failures are rare and keep their text under the mutex.
uint64_t FlightRecorder::record(uint32_t group, const OpLabel& label,
                                std::chrono::steady_clock::time_point when, bool started) {
  if (!enabled_) return 0;
  const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
  Entry& e = ring_[id % ring_.size()];
  e.id.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);  // the 0 is seen before new fields
  if (e.has_error.load(std::memory_order_relaxed)) {
    std::lock_guard lock(mutex_);
    e.error.clear();
    e.has_error.store(false, std::memory_order_relaxed);
  }
  constexpr auto relaxed = std::memory_order_relaxed;
  e.group.store(group, relaxed);
  e.kind.store(label.kind.data(), relaxed);
  e.kind_length.store(static_cast<uint32_t>(label.kind.size()), relaxed);
  e.dtype.store(label.dtype.data(), relaxed);
  e.dtype_length.store(static_cast<uint32_t>(label.dtype.size()), relaxed);
  e.seq.store(label.seq, relaxed);
  e.bytes.store(label.bytes, relaxed);
  e.peer.store(label.peer, relaxed);
  const int64_t at = us_of(when);
  e.state.store(started ? kStarted : kQueued, relaxed);
  e.queued_us.store(at, relaxed);
  e.started_us.store(started ? at : -1, relaxed);
  e.completed_us.store(-1, relaxed);
  e.id.store(id, std::memory_order_release);
  return id;
}

FlightRecorder::Entry* FlightRecorder::find(uint64_t id) {
  if (id == 0) return nullptr;
  Entry& e = ring_[id % ring_.size()];
  // Overwritten by a newer operation (4096 later): nothing to update.
  return e.id.load(std::memory_order_acquire) == id ? &e : nullptr;
}

void FlightRecorder::started(uint64_t id, std::chrono::steady_clock::time_point when) {
  if (Entry* e = find(id)) {
    e->started_us.store(us_of(when), std::memory_order_relaxed);
    e->state.store(kStarted, std::memory_order_release);
  }
}

void FlightRecorder::completed(uint64_t id, std::chrono::steady_clock::time_point when,
                               std::string_view error) {
  Entry* e = find(id);
  if (e == nullptr) return;
  if (!error.empty()) {
    std::lock_guard lock(mutex_);
    e->error = error;
    e->has_error.store(true, std::memory_order_relaxed);
  }
  e->completed_us.store(us_of(when), std::memory_order_relaxed);
  e->state.store(error.empty() ? kCompleted : kFailed, std::memory_order_release);
}

std::string FlightRecorder::json(int rank) const {
  std::lock_guard lock(mutex_);
  constexpr auto relaxed = std::memory_order_relaxed;
  nlohmann::json entries = nlohmann::json::array();
  const uint64_t next = next_id_.load(std::memory_order_acquire);
  const uint64_t first = next > ring_.size() ? next - ring_.size() : 1;
  for (uint64_t id = first; id < next; ++id) {
    const Entry& e = ring_[id % ring_.size()];
    if (e.id.load(std::memory_order_acquire) != id) continue;  // being filled, or newer
    const uint32_t group = e.group.load(relaxed);
    const std::string kind = text_of(e.kind.load(relaxed), e.kind_length.load(relaxed));
    const std::string dtype = text_of(e.dtype.load(relaxed), e.dtype_length.load(relaxed));
    const uint64_t seq = e.seq.load(relaxed), bytes = e.bytes.load(relaxed);
    const int32_t peer = e.peer.load(relaxed);
    const int64_t queued = e.queued_us.load(relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.id.load(relaxed) != id) continue;  // refilled while read
    const Group& g = groups_[group];
    entries.push_back({{"group", g.name},
                       {"group_rank", g.rank},
                       {"group_size", g.size},
                       {"seq", seq},
                       {"op", kind},
                       {"bytes", bytes},
                       {"dtype", dtype},
                       {"peer", peer},
                       {"state", state_name(e.state.load(std::memory_order_acquire))},
                       {"queued_us", queued},
                       {"started_us", e.started_us.load(relaxed)},
                       {"completed_us", e.completed_us.load(relaxed)},
                       {"error", e.has_error.load(relaxed) ? e.error : std::string()}});
  }
  return nlohmann::json{{"rank", rank}, {"entries", entries}}.dump(1);
}

void FlightRecorder::dump(const std::filesystem::path& path, int rank) const {
  const std::filesystem::path temporary = path.string() + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    out << json(rank) << "\n";
  }
  std::filesystem::rename(temporary, path);
}

void FlightRecorder::dump_if_configured(int fallback_rank) const noexcept {
  const char* dir = tunable_value(tunables::kFlightRecorderDir);
  if (dir == nullptr || *dir == '\0') return;
  try {
    int noted = -1;
    {
      std::lock_guard lock(mutex_);
      noted = rank_;
    }
    const int rank = job_rank(noted, fallback_rank);
    std::filesystem::create_directories(dir);
    dump(std::filesystem::path(dir) / ("flight.rank-" + std::to_string(rank) + ".json"), rank);
  } catch (...) {
    // A diagnosis aid must not turn one failure into another.
  }
}

void FlightRecorder::note_rank(int rank) {
  std::lock_guard lock(mutex_);
  if (rank_ < 0) rank_ = rank;
}

void FlightRecorder::install_signal_dump() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* dir = tunable_value(tunables::kFlightRecorderDir);
    if (dir == nullptr || *dir == '\0' || ::pipe(signal_pipe) != 0) return;
    std::thread([] {
      char byte = 0;
      while (::read(signal_pipe[0], &byte, 1) == 1)
        FlightRecorder::global().dump_if_configured(0);
    }).detach();
    struct sigaction action {};
    action.sa_handler = on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &action, nullptr);
  });
}

}  // namespace loom::comm
