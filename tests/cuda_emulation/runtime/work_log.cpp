#include "work_log.h"

#include <stdexcept>

namespace loom::cuda_emulation {
namespace {

std::mutex live_mutex;
WorkLog* live = nullptr;

}  // namespace

WorkLog::WorkLog() {
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

void WorkLog::add(WorkKind kind, const char* name, bool replayed) {
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(Work{kind, name, replayed});
}

void record_work(WorkKind kind, const char* name, bool replayed) {
  std::lock_guard<std::mutex> lock(live_mutex);
  if (live != nullptr) live->add(kind, name, replayed);
}

}  // namespace loom::cuda_emulation
