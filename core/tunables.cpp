#include "core/tunables.h"

#include <cstdlib>

namespace loom {

// README's order; tests/test_tunables.cpp also checks that every declaration is listed.
std::span<const Tunable> all_tunables() {
  using namespace tunables;
  // clang-format off
  static constexpr Tunable kAll[] = {
      kDebug,
      kStoreSecret,
      kStorePort,
      kHierarchicalNetwork,
      kHostId,
      kClusterEnv,
      kShmSliceBytes,
      kShmOneShotBytes,
      kShmChannelBytes,
      kRestartCount,
      kStoreServedByLauncher,
      kJobId,
      kFlightRecorderDir,
      kFlightRecorder,
      kCommTiming,
      kPerfCommand,
      kBf16Gemm,
      kCudaAttention,
  };
  // clang-format on
  return kAll;
}

const char* tunable_value(const Tunable& tunable) {
  return std::getenv(tunable.name);
}

}  // namespace loom
