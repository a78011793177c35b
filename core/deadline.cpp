#include "core/deadline.h"

#include <cstdio>

namespace loom {

std::string duration_str(Duration d) {
  using namespace std::chrono;
  char text[32];
  if (d >= minutes(1) && d % minutes(1) == Duration::zero()) {
    std::snprintf(text, sizeof text, "%lld min", static_cast<long long>(d / minutes(1)));
  } else if (d >= seconds(1)) {
    std::snprintf(text, sizeof text, "%g s", static_cast<double>(d.count()) / 1000.0);
  } else {
    std::snprintf(text, sizeof text, "%lld ms", static_cast<long long>(d.count()));
  }
  return text;
}

}  // namespace loom
