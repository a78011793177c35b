#pragma once
// Devices as users write them (Lightning's `devices`): "auto", a count "N", "-1" (all), or
// indices "0,2". Parsed against the accelerator:
//  - CPU: a count means processes or replicas, and "auto" and "-1" mean 1 (as Lightning's CPU
//    accelerator); indices select GPUs and are an error that says what to write instead.
//  - GPU: "auto" and "-1" mean every visible GPU, "N" the first N of them, and "0,2" exactly
//    those. Indices count the GPUs this process sees, so under CUDA_VISIBLE_DEVICES=4,6 index
//    0 is physical GPU 4 (as in PyTorch). More GPUs than are visible, an index past them, or
//    one listed twice is an error naming what is visible.

#include <string>
#include <vector>

#include "strategies/plugins.h"

namespace loom::strategies {

struct DeviceSelection {
  int count = 1;
  std::vector<int> indices;  // GPU: the visible devices used, in rank order; CPU: empty
};

// Throws loom::Error naming the accepted forms.
DeviceSelection parse_devices(const std::string& devices, const Accelerator& accelerator);

}  // namespace loom::strategies
