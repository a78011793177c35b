#include "core/deadline.h"

#include <time.h>

#include <cstdio>

namespace loom {

Clock::time_point coarse_now() {
#ifdef CLOCK_MONOTONIC_COARSE
  timespec now;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(
      std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec)));
#else
  return Clock::now();
#endif
}

Clock::duration coarse_clock_lag() {
#ifdef CLOCK_MONOTONIC_COARSE
  static const Clock::duration lag = [] {
    timespec resolution{};
    ::clock_getres(CLOCK_MONOTONIC_COARSE, &resolution);
    return 2 * std::chrono::duration_cast<Clock::duration>(
                   std::chrono::seconds(resolution.tv_sec) +
                   std::chrono::nanoseconds(resolution.tv_nsec));
  }();
  return lag;
#else
  return Clock::duration::zero();
#endif
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

}  // namespace loom
