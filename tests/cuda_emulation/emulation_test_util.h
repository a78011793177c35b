#pragma once
// Shared by the kernel emulation tests: device-typed buffers on the host, random data, the
// schedules every kernel runs under, and error measures against the CPU kernels.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "emulator.h"

namespace loom::cuda_emulation::testing {

// Forward, reverse, one shuffled order and warp by warp: a missing barrier shows under at
// least one of them (test_emulator's AMissingBarrier... tests).
inline std::vector<Schedule> schedules() {
  return {{Order::kForward, 0}, {Order::kReverse, 0}, {Order::kShuffled, 7},
          {Order::kWarpsReverse, 0}};
}

// Runs `body` once per schedule, naming the schedule in any failure; restores the default
// and clears any trap afterwards.
template <typename F>
void for_each_schedule(F&& body) {
  for (const Schedule& s : schedules()) {
    set_schedule(s);
    SCOPED_TRACE("schedule " + describe(s));
    body();
  }
  set_schedule({});
  clear_device_error();
}

template <typename T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  if constexpr (std::is_same_v<T, double>) return DType::F64;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return DType::BF16;
  if constexpr (std::is_same_v<T, __half>) return DType::F16;
  if constexpr (std::is_same_v<T, int32_t>) return DType::I32;
  if constexpr (std::is_same_v<T, int64_t>) return DType::I64;
  if constexpr (std::is_same_v<T, uint8_t>) return DType::U8;
}

template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return static_cast<double>(__bfloat162float(v));
  else if constexpr (std::is_same_v<T, __half>)
    return static_cast<double>(__half2float(v));
  else
    return static_cast<double>(v);
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// The storage type's values widened to the CPU kernels' type (float, or double for f64).
template <typename T>
using Wide = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
std::vector<Wide<T>> widen_all(const std::vector<T>& v) {
  std::vector<Wide<T>> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<Wide<T>>(to_double(v[i]));
  return out;
}

// Values uniform in [lo, hi), rounded to T (so the CPU sees exactly what the kernel reads).
template <typename T>
std::vector<T> random_values(size_t n, std::mt19937_64& rng, double lo = -2.0, double hi = 2.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (auto& e : v) e = from_double<T>(u(rng));
  return v;
}

// The largest |a - b| / max(|b|, floor) over the elements; NaN anywhere counts as infinite.
template <typename A, typename B>
double max_relative_error(const std::vector<A>& got, const std::vector<B>& want,
                          double floor = 1.0) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double g = to_double(got[i]), w = to_double(want[i]);
    if (std::isnan(g) != std::isnan(w)) return INFINITY;
    if (std::isnan(g)) continue;
    worst = std::max(worst, std::abs(g - w) / std::max(std::abs(w), floor));
  }
  return worst;
}

template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  // (Empty vectors may hold null, which memcmp must not be given.)
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Relative to max(|x|, 1). f32 results: a few ulps of the CPU's f32 after a different
// summation order. bf16 and f16 results rounded once from f32: half a unit in their last
// place (2^-8 and 2^-11 of the value: 7 and 10 stored significand bits), plus the f32
// differences before rounding.
template <typename T>
constexpr double tolerance() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  if constexpr (std::is_same_v<T, float>) return 5e-6;
  if constexpr (std::is_same_v<T, __half>) return 0.5 / 1024 + 1e-5;
  return 0.5 / 128 + 1e-5;  // bf16
}

}  // namespace loom::cuda_emulation::testing
