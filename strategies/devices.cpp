#include "strategies/devices.h"

#include <algorithm>
#include <charconv>
#include <sstream>

#include "core/tags.h"

namespace loom::strategies {

namespace {

bool parse_int(const std::string& text, int& value) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

DeviceSelection parse_devices(const std::string& devices, const Accelerator& accelerator) {
  const bool cpu = accelerator.name() == "cpu";
  const int visible = accelerator.visible_devices();
  auto first = [](int n) {
    DeviceSelection all{n, std::vector<int>(static_cast<size_t>(n))};
    for (int i = 0; i < n; ++i) all.indices[static_cast<size_t>(i)] = i;
    return all;
  };
  if (devices == "auto" || devices == "-1") return cpu ? DeviceSelection{1, {}} : first(visible);
  int count = 0;
  if (parse_int(devices, count)) {
    if (count < 1) {
      tag::kStrategy.fail("devices=", devices,
                          " is not valid; expected 'auto', a count >= 1, '-1' "
                          "(all) or device indices like '0,2'");
    }
    if (cpu) return {count, {}};
    if (count > visible) {
      tag::kStrategy.fail("devices=", count, " but this process sees ", visible, " ",
                          accelerator.name(),
                          " device(s) (after CUDA_VISIBLE_DEVICES); ask for at most ", visible,
                          " or use devices=auto");
    }
    return first(count);
  }
  std::vector<int> indices;
  std::stringstream in(devices);
  std::string item;
  while (std::getline(in, item, ',')) {
    int index = 0;
    if (!parse_int(item, index) || index < 0) {
      tag::kStrategy.fail("devices='", devices,
                          "' is not valid; expected 'auto', a count, '-1' or "
                          "device indices like '0,2'");
    }
    if (std::find(indices.begin(), indices.end(), index) != indices.end())
      tag::kStrategy.fail("devices='", devices, "' lists device ", index, " twice");
    indices.push_back(index);
  }
  if (cpu) {
    tag::kStrategy.fail("devices='", devices,
                        "' lists device indices, which select GPUs; with the "
                        "CPU accelerator pass a number of processes instead, e.g. devices=",
                        indices.size());
  }
  for (int index : indices) {
    if (index >= visible) {
      tag::kStrategy.fail("devices='", devices, "' names device ", index,
                          ", but this process sees ", visible, " ", accelerator.name(),
                          " device(s), indices 0..", visible - 1, " (after CUDA_VISIBLE_DEVICES)");
    }
  }
  return {static_cast<int>(indices.size()), indices};
}

}  // namespace loom::strategies
