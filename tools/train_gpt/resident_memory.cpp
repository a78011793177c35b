#include "tools/train_gpt/resident_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace loom::train_gpt {

ResidentMemory resident_memory() {
  ResidentMemory m;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    // Lines such as "VmHWM:\t  123456 kB".
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "VmRSS:") m.current_bytes = kib * 1024;
    if (key == "VmHWM:") m.peak_bytes = kib * 1024;
  }
  return m;
}

}  // namespace loom::train_gpt
