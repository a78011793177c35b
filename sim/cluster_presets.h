#pragma once
// The cluster presets built into the library: sim/clusters/NAME.json, read at configure time
// into a generated source (sim/CMakeLists.txt), so an installed loom-sim has them.

#include <vector>

namespace loom::sim {

struct ClusterPreset {
  const char* name;  // the file's name without .json
  const char* json;  // its text
};

const std::vector<ClusterPreset>& built_in_cluster_presets();

}  // namespace loom::sim
