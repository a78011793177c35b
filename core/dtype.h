#pragma once
// Element types and their conversions. bf16 and f16 are stored as raw 16-bit patterns and
// converted with round-to-nearest-even; arithmetic on them happens in f32.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace loom {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U8 };

// Raw 16-bit float patterns; distinct types so that templates can dispatch on them.
struct BFloat16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

// Inline: every tensor access asks it. An out-of-range value (memory corruption) fails in
// invalid_dtype_size().
[[noreturn]] void invalid_dtype_size(DType dtype);
inline size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::BF16:
    case DType::F16: return 2;
    case DType::U8: return 1;
  }
  invalid_dtype_size(dtype);
}
// The one dtype -> C++ type dispatch on the host: calls f.template operator()<T>() with the
// storage type of `dtype` (float, double, BFloat16, Half, int32_t, int64_t, uint8_t) and
// returns what it returns. Its device twin, with CUDA's __nv_bfloat16 and __half, is
// visit_device_dtype in kernels/cuda/common.cuh.
template <typename F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: return f.template operator()<float>();
    case DType::F64: return f.template operator()<double>();
    case DType::BF16: return f.template operator()<BFloat16>();
    case DType::F16: return f.template operator()<Half>();
    case DType::I32: return f.template operator()<int32_t>();
    case DType::I64: return f.template operator()<int64_t>();
    case DType::U8: return f.template operator()<uint8_t>();
  }
  invalid_dtype_size(dtype);
}

// "f32", "bf16", ...: a static NUL-terminated string, so printf and C APIs take it too.
const char* dtype_name(DType dtype);
bool is_floating(DType dtype);
inline bool is_16bit_float(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16; }
// Parses "f32", "float32", "bf16", ...; throws loom::Error listing the accepted names.
DType parse_dtype(std::string_view name);

// Round-to-nearest-even conversions; NaN stays NaN, overflow becomes infinity. Inline, so that
// the loops converting tensors vectorise.
inline uint16_t float_to_bf16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if (value != value) return static_cast<uint16_t>((bits >> 16) | 0x0040);  // quiet NaN
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
  const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
inline float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}
uint16_t float_to_f16_bits(float value);
float f16_bits_to_float(uint16_t bits);

// Maps a C++ element type to its DType: dtype_of<float>() == DType::F32.
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::F16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::U8;
}

std::ostream& operator<<(std::ostream& out, DType dtype);

}  // namespace loom
