#include "comm/error.h"

#include <time.h>

#include <cstdio>

namespace loom::comm {

Clock::time_point coarse_now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

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

}  // namespace loom::comm
