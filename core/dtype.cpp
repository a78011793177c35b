#include "core/dtype.h"

#include <bit>
#include <cmath>
#include <ostream>

#include "core/error.h"
#include "core/half.h"

namespace loom {

void invalid_dtype_size(DType dtype) {
  fail("dtype_size: invalid dtype value ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "invalid";
}

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::F64 || dtype == DType::BF16 || dtype == DType::F16;
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::F32},     {"float32", DType::F32}, {"f64", DType::F64},
      {"float64", DType::F64}, {"bf16", DType::BF16},   {"bfloat16", DType::BF16},
      {"f16", DType::F16},     {"float16", DType::F16}, {"i32", DType::I32},
      {"int32", DType::I32},   {"i64", DType::I64},     {"int64", DType::I64},
      {"u8", DType::U8},       {"uint8", DType::U8}};
  for (const Alias& alias : kAliases) {
    if (alias.name == name) return alias.dtype;
  }
  fail("unknown dtype '", name, "'; expected one of f32, f64, bf16, f16, i32, i64, u8");
}

// Round to nearest even, as the F16C instructions and GCC's _Float16 do (core/half.h).
uint16_t float_to_f16_bits(float value) {
  return kernels::cpu::f32_to_f16_bits(value);
}

float f16_bits_to_float(uint16_t bits) {
  return kernels::cpu::f16_bits_to_f32(bits);
}

std::ostream& operator<<(std::ostream& out, DType dtype) {
  return out << dtype_name(dtype);
}

}  // namespace loom
