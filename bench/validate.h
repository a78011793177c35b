#pragma once
// Shared by the benchmarks: every benchmark checks its kernel against a plain reference
// before timing it, and reports the error it found.

#include <benchmark/benchmark.h>

#include <cmath>
#include <string>
#include <vector>

namespace loom::bench {

struct Error {
  double max_abs = 0, max_rel = 0;
};

template <typename A, typename B>
Error compare(const std::vector<A>& got, const std::vector<B>& want) {
  Error e;
  for (size_t i = 0; i < got.size(); ++i) {
    double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    e.max_abs = std::max(e.max_abs, d);
    e.max_rel = std::max(e.max_rel, d / (std::abs(static_cast<double>(want[i])) + 1e-6));
  }
  if (got.size() != want.size()) e.max_abs = e.max_rel = INFINITY;
  return e;
}

// Records the validation result as counters; returns false (and marks the benchmark as
// failed) when the error exceeds `tolerance` (absolute, per element, relative to 1 + |want|).
inline bool validated(benchmark::State& state, const Error& e, double tolerance) {
  state.counters["max_abs_err"] = e.max_abs;
  state.counters["max_rel_err"] = e.max_rel;
  if (!(e.max_abs <= tolerance)) {
    state.SkipWithError(
        ("validation against the reference failed: max abs error " + std::to_string(e.max_abs))
            .c_str());
    return false;
  }
  return true;
}

}  // namespace loom::bench
