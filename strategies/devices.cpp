#include "strategies/devices.h"

#include <charconv>
#include <sstream>

namespace loom::strategies {

namespace {

bool parse_int(const std::string& text, int& value) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

DeviceSelection parse_devices(const std::string& devices, const Accelerator& accelerator) {
  const bool cpu = accelerator.name() == "cpu";
  if (devices == "auto" || devices == "-1") return {1, {}};
  int count = 0;
  if (parse_int(devices, count)) {
    if (count < 1) {
      fail("[strategy] devices=", devices,
           " is not valid; expected 'auto', a count >= 1, '-1' "
           "(all) or device indices like '0,2'");
    }
    return {count, {}};
  }
  std::vector<int> indices;
  std::stringstream in(devices);
  std::string item;
  while (std::getline(in, item, ',')) {
    int index = 0;
    if (!parse_int(item, index) || index < 0) {
      fail("[strategy] devices='", devices,
           "' is not valid; expected 'auto', a count, '-1' or "
           "device indices like '0,2'");
    }
    indices.push_back(index);
  }
  if (cpu) {
    fail("[strategy] devices='", devices,
         "' lists device indices, which select GPUs; with the "
         "CPU accelerator pass a number of processes instead, e.g. devices=",
         indices.size());
  }
  return {static_cast<int>(indices.size()), indices};
}

}  // namespace loom::strategies
