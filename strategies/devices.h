#pragma once
// Devices as users write them (Lightning's `devices`): "auto", a count "N", "-1" (all), or
// indices "0,2". Parsed against the accelerator: on the CPU a count means processes or
// replicas and "auto" and "-1" mean 1 (as Lightning's CPU accelerator); indices select GPUs
// and are an error on the CPU that says what to write instead.

#include <string>
#include <vector>

#include "strategies/plugins.h"

namespace loom::strategies {

struct DeviceSelection {
  int count = 1;
  std::vector<int> indices;  // empty unless the user listed indices
};

// Throws loom::Error naming the accepted forms.
DeviceSelection parse_devices(const std::string& devices, const Accelerator& accelerator);

}  // namespace loom::strategies
