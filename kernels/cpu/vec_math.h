#pragma once
// Transcendental functions written so that GCC vectorises the loops that call them
// (std::exp/std::tanh on floats are scalar library calls). f32 uses a Cephes-style
// polynomial (max relative error about 2e-7 over the clamped range); f64 stays exact
// (std::exp), since f64 is what the gradient checks run in.

#include <bit>
#include <cmath>
#include <cstdint>

namespace loom::kernels::cpu {

inline float exp_approx(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  float k = std::floor(x * kLog2e + 0.5f);
  float r = x - k * kLn2Hi - k * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // A NaN x leaves k NaN, whose conversion to an integer is undefined; p carries the NaN
  // out whatever the scale, so NaN takes the scale 1.
  int32_t exponent = ((k == k ? static_cast<int32_t>(k) : 0) + 127) << 23;
  return p * std::bit_cast<float>(exponent);
}

inline double exp_approx(double x) {
  return std::exp(x);
}

// tanh(u) = 1 - 2 / (exp(2u) + 1); exact limits at +-infinity of the clamped exp.
inline float tanh_approx(float u) {
  return 1.0f - 2.0f / (exp_approx(2.0f * u) + 1.0f);
}
inline double tanh_approx(double u) {
  return std::tanh(u);
}

}  // namespace loom::kernels::cpu
