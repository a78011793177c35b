#pragma once
// The CPU's element conversion rules (tensor/ops/copy.cpp, core/dtype.cpp's bf16 and
// core/half.h's f16 rounding) one element at a time: the oracle for the CUDA
// conversions (copy_strided, fill, the communication layer's convert).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/half.h"

namespace loom::cuda_emulation::testing {

// Element sizes and kinds are core/dtype.h's (dtype_size, is_floating); the test programs
// that include this link core/dtype.cpp.

// An element read as the CPU reads it: integers exactly, floats widened to double.
inline double read_double(DType d, const unsigned char* p) {
  switch (d) {
    case DType::F32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::F64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::BF16: { uint16_t b; std::memcpy(&b, p, 2); return bf16_bits_to_float(b); }
    case DType::F16: { uint16_t b; std::memcpy(&b, p, 2); return kernels::cpu::f16_bits_to_f32(b); }
    case DType::I32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::I64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::U8: return *p;
  }
  return 0;
}

inline int64_t read_integer(DType d, const unsigned char* p) {
  switch (d) {
    case DType::I32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::I64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    default: return *p;
  }
}

inline void write_converted(DType src, const unsigned char* in, DType dst, unsigned char* out) {
  if (!is_floating(src) && !is_floating(dst)) {  // wraps like static_cast
    const int64_t v = read_integer(src, in);
    if (dst == DType::I32) { const auto w = static_cast<int32_t>(v); std::memcpy(out, &w, 4); }
    if (dst == DType::I64) std::memcpy(out, &v, 8);
    if (dst == DType::U8) *out = static_cast<uint8_t>(v);
    return;
  }
  const double v = read_double(src, in);
  switch (dst) {
    case DType::F32: { const auto f = static_cast<float>(v); std::memcpy(out, &f, 4); return; }
    case DType::F64: std::memcpy(out, &v, 8); return;
    case DType::BF16: { const uint16_t b = float_to_bf16_bits(static_cast<float>(v)); std::memcpy(out, &b, 2); return; }
    case DType::F16: { const uint16_t b = kernels::cpu::f32_to_f16_bits(static_cast<float>(v)); std::memcpy(out, &b, 2); return; }
    case DType::I32: { const auto i = static_cast<int32_t>(v); std::memcpy(out, &i, 4); return; }
    case DType::I64: { const auto i = static_cast<int64_t>(v); std::memcpy(out, &i, 8); return; }
    case DType::U8: *out = static_cast<uint8_t>(static_cast<int32_t>(v)); return;
  }
}

// Raw elements of dtype d with values the CPU converts without undefined behaviour (integers
// in range of every integer type after truncation; floats with fractions, NaN for floats).
inline std::vector<unsigned char> random_elements(DType d, int64_t n, std::mt19937_64& rng, bool nan) {
  std::vector<unsigned char> raw(static_cast<size_t>(n) * dtype_size(d));
  std::uniform_real_distribution<double> u(-120.0, 120.0);
  for (int64_t i = 0; i < n; ++i) {
    double v = u(rng);
    if (nan && is_floating(d) && i % 17 == 5) v = std::nan("");
    unsigned char* p = raw.data() + i * dtype_size(d);
    if (!is_floating(d)) {
      const auto k = static_cast<int64_t>(v);
      if (d == DType::I32) { const auto w = static_cast<int32_t>(k); std::memcpy(p, &w, 4); }
      if (d == DType::I64) std::memcpy(p, &k, 8);
      if (d == DType::U8) *p = static_cast<uint8_t>(k);
    } else {
      write_converted(DType::F64, reinterpret_cast<const unsigned char*>(&v), d, p);
    }
  }
  return raw;
}

inline const DType kAllDtypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                            DType::I32, DType::I64, DType::U8};

}  // namespace loom::cuda_emulation::testing
