#include "tensor/device.h"

#include <charconv>

#include "core/error.h"

namespace loom {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text == "meta") return meta();
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0) {
      return cuda(index);
    }
  }
  fail("unknown device '", text, "'; expected 'cpu', 'cuda', 'cuda:N' or 'meta'");
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  if (is_meta()) return "meta";
  return "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, const Device& device) {
  return out << device.str();
}

}  // namespace loom
