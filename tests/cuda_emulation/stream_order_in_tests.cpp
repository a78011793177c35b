// Linked into every test program that runs the whole library on the emulated device
// (loom_emulated_cuda_test in CMakeLists.txt): each test runs under a StreamOrderCheck of the
// caching allocator's blocks (Note [The stream-order check] in runtime/stream_order.h) and
// fails with each race it finds, so that no test of ops, graphs, training or collectives
// leaves device memory to two streams with nothing ordering them. Forked ranks check their
// own work in their copy, unreported.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "device_allocations.h"
#include "runtime/stream_order.h"

namespace loom::cuda_emulation {
namespace {

class StreamOrderInEveryTest : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo&) override {
    check_ = std::make_unique<StreamOrderCheck>(device_allocation);
  }
  // Listeners' end events run in reverse order, so these failures come before the printer's
  // verdict on the test.
  void OnTestEnd(const ::testing::TestInfo&) override {
    if (!check_) return;
    const std::vector<std::string> races = check_->races();
    check_.reset();
    for (const std::string& race : races)
      ADD_FAILURE() << "stream-order check: " << race;
  }

 private:
  std::unique_ptr<StreamOrderCheck> check_;
};

const bool installed = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new StreamOrderInEveryTest);
  return true;
}();

}  // namespace
}  // namespace loom::cuda_emulation
