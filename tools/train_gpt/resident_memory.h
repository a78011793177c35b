#pragma once
// This process's resident memory, as the kernel counts it (Linux /proc/self/status): what
// train_gpt reports beside its tensor bytes so that a run compares with a Python peer's
// (docs/performance.md: RSS above the RSS before the model is built, on both sides).

#include <cstdint>

namespace loom::train_gpt {

struct ResidentMemory {
  int64_t current_bytes = 0;  // VmRSS
  int64_t peak_bytes = 0;     // VmHWM: the largest VmRSS since the process started
};

// Zeros where /proc/self/status cannot be read or lacks the fields (not Linux).
ResidentMemory resident_memory();

}  // namespace loom::train_gpt
