// Linked into train_gpt_emulated: with LOOM_STREAM_ORDER_CHECK=1 in its environment, the whole
// run of each process is checked (Note [The stream-order check] in runtime/stream_order.h), the
// caching allocator's blocks being the allocations followed; at exit the races found are printed
// and the process exits with status 86. strategies_on_emulated_cuda.sh sets it for every job.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "device_allocations.h"
#include "runtime/stream_order.h"

namespace loom::cuda_emulation {
namespace {

constexpr int kRacesFound = 86;

class CheckedRun {
 public:
  CheckedRun() {
    const char* flag = std::getenv("LOOM_STREAM_ORDER_CHECK");
    if (flag != nullptr && std::strcmp(flag, "1") == 0)
      check_ = std::make_unique<StreamOrderCheck>(device_allocation);
  }
  ~CheckedRun() {
    if (!check_) return;
    const std::vector<std::string> races = check_->races();
    check_.reset();
    if (races.empty()) return;
    for (const std::string& race : races)
      std::fprintf(stderr, "stream-order check: %s\n", race.c_str());
    std::fprintf(stderr, "stream-order check: %zu unordered pair(s) of accesses\n", races.size());
    std::_Exit(kRacesFound);
  }

 private:
  std::unique_ptr<StreamOrderCheck> check_;
};

const CheckedRun checked_run;

}  // namespace
}  // namespace loom::cuda_emulation
