#pragma once
// IEEE binary16 (f16) <-> binary32 conversions in plain C++, for every compiler (_Float16 on
// x86 needs GCC 12 or clang 15). The results are those of the F16C instructions and of GCC's
// _Float16, bit for bit (checked for every input): f32 -> f16 rounds to nearest even,
// overflows to infinity and keeps subnormal results; f16 -> f32 is exact. A NaN stays a NaN
// of the same sign, made quiet, its payload cut to f16's 10 bits or extended with zeros.
// Each result is chosen from values all computed (no branches), so that loops over them
// vectorise; subnormals go through one f32 addition or subtraction, exact or rounded to
// nearest even in the default floating-point environment, which Loom never changes.

#include <bit>
#include <cstdint>

namespace loom::kernels::cpu {

inline float f16_bits_to_f32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t shifted = static_cast<uint32_t>(bits & 0x7FFFu) << 13;  // f16's fields at f32's
  const uint32_t exponent = shifted & 0x0F800000u;
  const uint32_t normal = shifted + (112u << 23);  // exponent rebiased: 127 - 15
  const uint32_t special = shifted | 0x7F800000u | ((shifted & 0x7FFFFFu) != 0 ? 0x400000u : 0u);
  // A subnormal's mantissa m under 2^-14's exponent is 2^-14 + m * 2^-24: drop the 2^-14.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(shifted + (113u << 23)) - 0x1p-14f);
  const uint32_t magnitude = exponent == 0x0F800000u ? special
                             : exponent == 0         ? subnormal
                                                     : normal;
  return std::bit_cast<float>(sign | magnitude);
}

inline uint16_t f32_to_f16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  const uint32_t special =  // 2^16 and up: infinity, or NaN made quiet
      0x7C00u | (magnitude > 0x7F800000u ? 0x200u | ((magnitude >> 13) & 0x3FFu) : 0u);
  // 2^-14 and up: exponent rebiased, 13 bits dropped with rounding to nearest even; from
  // 65520 the rounding carries into the infinity's exponent.
  const uint32_t normal = (magnitude - 0x38000000u + 0xFFFu + ((magnitude >> 13) & 1u)) >> 13;
  // Below 2^-14: adding 0.5 (ulp 2^-24) rounds the value to whole units of 2^-24, which are
  // f16's subnormal mantissa (1024 of them: the smallest normal).
  const uint32_t subnormal = std::bit_cast<uint32_t>(std::bit_cast<float>(magnitude) + 0.5f) -
                             std::bit_cast<uint32_t>(0.5f);
  const uint32_t result = magnitude >= 0x47800000u   ? special
                          : magnitude >= 0x38800000u ? normal
                                                     : subnormal;
  return static_cast<uint16_t>(sign | result);
}

}  // namespace loom::kernels::cpu
