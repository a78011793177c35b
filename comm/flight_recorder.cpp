#include "comm/flight_recorder.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>

#include "comm/environment.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/tags.h"
#include "core/tunables.h"
namespace loom::comm {

namespace {

// An OpLabel's string_view as kept in an entry (an empty one may have no pointer).
std::string text_of(const char* data, uint32_t size) {
  return size == 0 ? std::string() : std::string(data, size);
}

const char* state_name(int state) {
  static const char* names[] = {"queued", "started", "completed", "failed"};
  return names[state];
}

int job_rank(int noted, int fallback) {
  if (const std::optional<int> rank = launcher_rank()) return *rank;
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

FlightRecorder::Log& FlightRecorder::register_group(const std::string& name, int group_rank,
                                                    int group_size) {
  std::lock_guard lock(mutex_);
  return logs_.emplace_back(*this, name, group_rank, group_size);
}

void FlightRecorder::close_group(Log& log) {
  std::lock_guard lock(mutex_);
  closed_.push_back(&log);
  if (closed_.size() <= kClosedFlightLogs) return;
  const Log* oldest = closed_.front();
  closed_.pop_front();
  logs_.remove_if([oldest](const Log& l) { return &l == oldest; });
}

FlightRecorder::Log::Log(FlightRecorder& recorder, std::string name, int rank, int size)
    : recorder_(recorder),
      name_(std::move(name)),
      rank_(rank),
      size_(size),
      enabled_(recorder.enabled()),
      entries_(enabled_ ? std::make_unique<Entry[]>(kFlightCapacity) : nullptr) {}

// Note [Lock-free records]
// record() runs on every operation's issue path, where a lock costs a tenth of a small
// call, so an entry is a seqlock: the writer clears the slot's id, fills every field with
// relaxed stores and publishes the id (seq + 1) with a release store. json() reads the id
// (acquire), the fields, then the id again after an acquire fence, and drops the entry if the
// id changed meanwhile (the group's operation kFlightCapacity later took the slot). Every
// field is an atomic, so a torn read is detected, never undefined. Failures are rare and keep
// their text under the recorder's mutex. An update (started, completed) that checked the id
// just before a new record took the slot can land in the new entry: only an operation that
// ran kFlightCapacity operations behind its group's issue could do that.
//
// Note [A line per record]
// A small call records an entry and completes it: a few stores, but to a line that the ring
// last touched kFlightCapacity calls ago. With one ring for all groups, an id taken by a
// locked fetch_add, entries of two lines and a division for the slot, the recorder cost 14
// ns of a 0.19 us two-rank 8-byte allreduce (docs/performance_comm.md, 2026-11-28 evening).
// So each group has its own ring, whose slot is the operation's sequence number (recorded by
// one thread at a time: no locked instruction), its low bits (no division), and an entry is
// one aligned line. A busy group no longer evicts a quiet group's last operations either.
void FlightRecorder::Log::forget_error(uint64_t seq) {
  std::lock_guard lock(recorder_.mutex_);
  errors_.erase(seq);
}

void FlightRecorder::Log::keep_error(uint64_t seq, std::string_view error) {
  std::lock_guard lock(recorder_.mutex_);
  errors_[seq] = error;
}

std::string FlightRecorder::json(int rank) const {
  std::lock_guard lock(mutex_);
  constexpr auto relaxed = std::memory_order_relaxed;
  nlohmann::json entries = nlohmann::json::array();
  for (const Log& log : logs_) {
    if (!log.enabled_) continue;
    // The entries by sequence number: the slots from the oldest one's on.
    std::vector<nlohmann::json> found;
    for (size_t slot = 0; slot < kFlightCapacity; ++slot) {
      const Log::Entry& e = log.entries_[slot];
      const uint64_t id = e.id.load(std::memory_order_acquire);
      if (id == 0) continue;  // empty, or being filled
      const std::string kind = text_of(e.kind.load(relaxed), e.kind_length.load(relaxed));
      const std::string dtype = text_of(e.dtype.load(relaxed), e.dtype_length.load(relaxed));
      const uint64_t bytes = e.bytes.load(relaxed);
      const int32_t peer = e.peer.load(relaxed);
      const int64_t queued = e.queued_us.load(relaxed);
      const int64_t started = e.started_us.load(relaxed);
      const int64_t completed = e.completed_us.load(relaxed);
      const int state = e.state.load(relaxed);
      const bool has_error = e.has_error.load(relaxed);
      std::atomic_thread_fence(std::memory_order_acquire);
      if (e.id.load(relaxed) != id) continue;  // refilled while read
      const uint64_t seq = id - 1;
      const auto error = log.errors_.find(seq);
      found.push_back(
          {{"group", log.name_},
           {"group_rank", log.rank_},
           {"group_size", log.size_},
           {"seq", seq},
           {"op", kind},
           {"bytes", bytes},
           {"dtype", dtype},
           {"peer", peer},
           {"state", state_name(state)},
           {"queued_us", queued},
           {"started_us", started},
           {"completed_us", completed},
           {"error", has_error && error != log.errors_.end() ? error->second : std::string()}});
    }
    std::sort(found.begin(), found.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return a.at("seq").get<uint64_t>() < b.at("seq").get<uint64_t>();
    });
    for (nlohmann::json& entry : found)
      entries.push_back(std::move(entry));
  }
  return nlohmann::json{{"rank", rank}, {"entries", entries}}.dump(1);
}

void FlightRecorder::dump(const std::filesystem::path& path, int rank) const {
  write_file_atomically(path, json(rank) + "\n", tag::kComm);
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

void FlightRecorder::check_dump_directory() {
  const char* dir = tunable_value(tunables::kFlightRecorderDir);
  if (dir == nullptr || *dir == '\0') return;
  const auto refuse = [&](const std::string& why) {
    tag::kComm.fail(tunables::kFlightRecorderDir.name, "='", dir, "' ", why,
                    "; set it to a directory this process may write (ranks dump their flight "
                    "recorder there when a collective fails), or unset it");
  };
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) refuse("cannot be created: " + error.message());
  if (!std::filesystem::is_directory(dir)) refuse("is not a directory");
  if (::access(dir, W_OK | X_OK) != 0) refuse(std::string("is not writable: ") + std::strerror(errno));
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
