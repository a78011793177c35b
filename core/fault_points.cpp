#include "core/fault_points.h"

#include <atomic>

namespace loom::fault {

#if LOOM_FAULT_POINTS
namespace {
std::atomic<Hook> installed{nullptr};
}  // namespace

int at(std::string_view point) noexcept {
  const Hook hook = installed.load(std::memory_order_acquire);
  return hook == nullptr ? 0 : hook(point);
}

void set_hook(Hook hook) noexcept {
  installed.store(hook, std::memory_order_release);
}
#endif

}  // namespace loom::fault
