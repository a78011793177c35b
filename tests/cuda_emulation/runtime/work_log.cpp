#include "work_log.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "stream_order.h"

namespace loom::cuda_emulation {
namespace {

std::mutex live_mutex;
WorkLog* live = nullptr;

}  // namespace

WorkLog::WorkLog() : WorkLog(AllocationLookup()) {}

WorkLog::WorkLog(AllocationLookup lookup) : lookup_(std::move(lookup)) {
  std::lock_guard<std::mutex> lock(live_mutex);
  if (live != nullptr) throw std::logic_error("a WorkLog already records the emulated device");
  live = this;
}

WorkLog::~WorkLog() {
  std::lock_guard<std::mutex> lock(live_mutex);
  live = nullptr;
}

std::vector<Work> WorkLog::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_;
}

void WorkLog::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.clear();
}

size_t WorkLog::launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const Work& w : entries_)
    n += w.kind == WorkKind::kKernel || w.kind == WorkKind::kMatmul ? 1 : 0;
  return n;
}

size_t WorkLog::host_launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const Work& w : entries_) {
    const bool kernel = w.kind == WorkKind::kKernel || w.kind == WorkKind::kMatmul;
    n += (kernel && !w.replayed) || w.kind == WorkKind::kGraph ? 1 : 0;
  }
  return n;
}

size_t WorkLog::argument_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const Work& w : entries_)
    n += w.argument_bytes;
  return n;
}

void WorkLog::add(WorkKind kind, const char* name, bool replayed, const ArgumentWords& words,
                  const void* stream) {
  size_t bytes = 0;
  if (lookup_ && (kind == WorkKind::kKernel || kind == WorkKind::kMatmul)) {
    std::vector<const void*> named;  // the allocations counted, by start
    for (const ArgumentWord& argument : words) {
      const void* word = argument.address;
      if (word == nullptr) continue;
      const std::optional<Allocation> allocation = lookup_(word);
      if (!allocation || std::find(named.begin(), named.end(), allocation->base) != named.end())
        continue;
      named.push_back(allocation->base);
      bytes += allocation->bytes;
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(Work{kind, name, replayed, bytes, stream});
}

void record_work(WorkKind kind, const char* name, bool replayed, const ArgumentWords& words,
                 const void* stream) {
  {
    std::lock_guard<std::mutex> lock(live_mutex);
    if (live != nullptr) live->add(kind, name, replayed, words, stream);
  }
  if (kind != WorkKind::kGraph && kind != WorkKind::kSync) note_device_work(name, words, stream);
}

}  // namespace loom::cuda_emulation
