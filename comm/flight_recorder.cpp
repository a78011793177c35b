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

uint64_t FlightRecorder::record(uint32_t group, const OpLabel& label,
                                std::chrono::steady_clock::time_point when) {
  if (!enabled_) return 0;
  const int64_t now = us_of(when);
  std::lock_guard lock(mutex_);
  const uint64_t id = next_id_++;
  Entry& e = ring_[id % ring_.size()];
  e.id.store(0, std::memory_order_relaxed);  // no update lands here while it is refilled
  e.group = group;
  e.label = label;
  e.state.store(kQueued, std::memory_order_relaxed);
  e.queued_us = now;
  e.started_us.store(-1, std::memory_order_relaxed);
  e.completed_us.store(-1, std::memory_order_relaxed);
  if (!e.error.empty()) e.error.clear();
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
                               const std::string& error) {
  Entry* e = find(id);
  if (e == nullptr) return;
  if (!error.empty()) {
    std::lock_guard lock(mutex_);
    e->error = error;
  }
  e->completed_us.store(us_of(when), std::memory_order_relaxed);
  e->state.store(error.empty() ? kCompleted : kFailed, std::memory_order_release);
}

std::string FlightRecorder::json(int rank) const {
  std::lock_guard lock(mutex_);
  nlohmann::json entries = nlohmann::json::array();
  const uint64_t first = next_id_ > ring_.size() ? next_id_ - ring_.size() : 1;
  for (uint64_t id = first; id < next_id_; ++id) {
    const Entry& e = ring_[id % ring_.size()];
    if (e.id.load(std::memory_order_acquire) != id) continue;
    const Group& g = groups_[e.group];
    entries.push_back({{"group", g.name},
                       {"group_rank", g.rank},
                       {"group_size", g.size},
                       {"seq", e.label.seq},
                       {"op", std::string(e.label.kind)},
                       {"bytes", e.label.bytes},
                       {"dtype", std::string(e.label.dtype)},
                       {"peer", e.label.peer},
                       {"state", state_name(e.state.load(std::memory_order_acquire))},
                       {"queued_us", e.queued_us},
                       {"started_us", e.started_us.load(std::memory_order_relaxed)},
                       {"completed_us", e.completed_us.load(std::memory_order_relaxed)},
                       {"error", e.error}});
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
