#include "stream_order.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <utility>

namespace loom::cuda_emulation {
namespace {

// The live checks: each sees all the device's work (a test's own inside one that covers the
// whole test, say).
constexpr int kMaxLive = 4;
std::atomic<StreamOrderCheck*> live[kMaxLive] = {};

template <typename Call>
void tell_live(Call call) {
  for (std::atomic<StreamOrderCheck*>& slot : live)
    if (StreamOrderCheck* check = slot.load()) call(*check);
}

std::string address(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

// Records `access` as its stream's latest in `list`.
template <typename Access>
void keep_latest(std::vector<Access>& list, Access access) {
  for (Access& a : list) {
    if (a.stream == access.stream) {
      a = std::move(access);
      return;
    }
  }
  list.push_back(std::move(access));
}

}  // namespace

StreamOrderCheck::StreamOrderCheck(AllocationLookup lookup) : lookup_(std::move(lookup)) {
  for (std::atomic<StreamOrderCheck*>& slot : live) {
    StreamOrderCheck* expected = nullptr;
    if (slot.compare_exchange_strong(expected, this)) return;
  }
  throw std::logic_error("more than 4 StreamOrderChecks at once");
}

StreamOrderCheck::~StreamOrderCheck() {
  for (std::atomic<StreamOrderCheck*>& slot : live) {
    StreamOrderCheck* expected = this;
    slot.compare_exchange_strong(expected, nullptr);
  }
}

void StreamOrderCheck::name(const void* stream, std::string label) {
  std::lock_guard<std::mutex> lock(mutex_);
  names_[stream] = std::move(label);
}

std::vector<std::string> StreamOrderCheck::races() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return races_;
}

void StreamOrderCheck::merge(Clock& into, const Clock& from) {
  for (const auto& [stream, tick] : from) {
    unsigned long long& mine = into[stream];
    mine = std::max(mine, tick);
  }
}

bool StreamOrderCheck::ordered_before(const Access& earlier, const Clock& now) const {
  auto it = now.find(earlier.stream);
  return it != now.end() && it->second >= earlier.tick;
}

std::string StreamOrderCheck::stream_name(const void* stream) const {
  auto it = names_.find(stream);
  if (it != names_.end()) return it->second;
  return stream == nullptr ? "the legacy default stream" : "stream " + address(stream);
}

void StreamOrderCheck::report(const Access& now, bool writes, const Access& then, bool then_wrote,
                              const char* base, size_t bytes) {
  const std::string kind = now.name + "|" + stream_name(now.stream) + "|" + (writes ? "w" : "r") +
                           "|" + then.name + "|" + stream_name(then.stream) + "|" +
                           (then_wrote ? "w" : "r");
  if (!kinds_.insert(kind).second) return;
  races_.push_back(now.name + " on " + stream_name(now.stream) + (writes ? " wrote " : " read ") +
                   std::to_string(bytes) + " bytes at " + address(base) + " that " + then.name +
                   " on " + stream_name(then.stream) + (then_wrote ? " wrote" : " read") +
                   " before, with nothing ordering them (no event recorded after the first and "
                   "waited for by the second's stream, no host wait between them)");
}

void StreamOrderCheck::work(const char* name, const ArgumentWords& words, const void* stream) {
  // The allocations touched, by start, and whether any word writes them; looked up before
  // taking the lock (the lookup takes the caching allocator's, which is held while it records
  // and queries events).
  struct Touched {
    size_t bytes;
    bool writes;
  };
  std::map<const char*, Touched> touched;
  for (const ArgumentWord& word : words) {
    if (word.address == nullptr) continue;
    const std::optional<Allocation> allocation = lookup_(word.address);
    if (!allocation) continue;
    auto [it, added] = touched.try_emplace(static_cast<const char*>(allocation->base),
                                           Touched{allocation->bytes, false});
    it->second.writes = it->second.writes || !word.read_only;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  Clock& clock = streams_[stream];
  merge(clock, host_);
  const Access now{stream, ++clock[stream], name};
  for (const auto& [base, t] : touched) {
    // Every history overlapping [base, base + bytes): those starting inside it, and the one
    // starting last before it (the blocks a caching allocator splits and joins).
    auto first = allocations_.lower_bound(base);
    if (first != allocations_.begin()) --first;
    for (auto it = first; it != allocations_.end() && it->first < base + t.bytes; ++it) {
      if (it->first + it->second.bytes <= base) continue;
      for (const Access& then : it->second.writes)
        if (!ordered_before(then, clock)) report(now, t.writes, then, true, base, t.bytes);
      if (!t.writes) continue;
      for (const Access& then : it->second.reads)
        if (!ordered_before(then, clock)) report(now, true, then, false, base, t.bytes);
    }
    History& history = allocations_[base];
    history.bytes = t.bytes;
    keep_latest(t.writes ? history.writes : history.reads, now);
  }
}

void StreamOrderCheck::event_recorded(const void* event, const void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  Clock& clock = streams_[stream];
  merge(clock, host_);
  events_[event] = clock;
}

void StreamOrderCheck::stream_waits(const void* stream, const void* event) {
  std::lock_guard<std::mutex> lock(mutex_);
  Clock& clock = streams_[stream];
  merge(clock, host_);
  auto it = events_.find(event);
  if (it != events_.end()) merge(clock, it->second);
}

void StreamOrderCheck::host_waited_for_event(const void* event) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(event);
  if (it != events_.end()) merge(host_, it->second);
}

void StreamOrderCheck::host_waited_for_stream(const void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = streams_.find(stream);
  if (it != streams_.end()) merge(host_, it->second);
}

void StreamOrderCheck::host_waited_for_device() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [stream, clock] : streams_)
    merge(host_, clock);
}

void note_device_work(const char* name, const ArgumentWords& words, const void* stream) {
  tell_live([&](StreamOrderCheck& check) { check.work(name, words, stream); });
}

void note_event_recorded(const void* event, const void* stream) {
  tell_live([&](StreamOrderCheck& check) { check.event_recorded(event, stream); });
}

void note_stream_waits(const void* stream, const void* event) {
  tell_live([&](StreamOrderCheck& check) { check.stream_waits(stream, event); });
}

void note_host_waited_for_event(const void* event) {
  tell_live([&](StreamOrderCheck& check) { check.host_waited_for_event(event); });
}

void note_host_waited_for_stream(const void* stream) {
  tell_live([&](StreamOrderCheck& check) { check.host_waited_for_stream(stream); });
}

void note_host_waited_for_device() {
  tell_live([&](StreamOrderCheck& check) { check.host_waited_for_device(); });
}

}  // namespace loom::cuda_emulation
