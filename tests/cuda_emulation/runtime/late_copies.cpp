#include "late_copies.h"

#include <mutex>
#include <utility>
#include <vector>

namespace loom::cuda_emulation {
namespace {

struct Pending {
  cudaStream_t stream;
  std::function<void()> copy;
};

std::mutex pending_mutex;
std::vector<Pending>& pending() {
  static std::vector<Pending> list;
  return list;
}

// Runs the pending copies `which` selects, in issue order, and drops them from the list. Under
// the lock throughout: another thread that lands copies returns only once those it needs are
// done, even when this call took them (a copy is a memmove and takes no lock).
template <typename Which>
void land(Which which) {
  std::lock_guard<std::mutex> lock(pending_mutex);
  std::vector<Pending>& list = pending();
  std::vector<Pending> later;
  for (Pending& p : list) {
    if (which(p)) {
      p.copy();
    } else {
      later.push_back(std::move(p));
    }
  }
  list = std::move(later);
}

}  // namespace

void defer_copy(cudaStream_t stream, std::function<void()> copy) {
  std::lock_guard<std::mutex> lock(pending_mutex);
  pending().push_back({stream, std::move(copy)});
}

void land_copies(cudaStream_t stream) {
  land([stream](const Pending& p) { return p.stream == stream; });
}

void land_all_copies() {
  land([](const Pending&) { return true; });
}

}  // namespace loom::cuda_emulation
