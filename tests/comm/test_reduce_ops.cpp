// The reduction kernels of the communication layer (kernels/cpu/reduce_ops.h): closed-form
// values for every type and kind, single rounding of bf16/f16, wrap-around, NaN and signed
// zero rules, aliasing, and bit-identical results from every instruction-set variant.

#include "kernels/cpu/reduce_ops.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/reduce_ops_impl.h"

namespace loom::kernels::cpu {
namespace {

using Bytes = std::vector<uint8_t>;

constexpr DType kAllTypes[] = {DType::F32, DType::F64, DType::BF16, DType::F16,
                               DType::I32, DType::I64, DType::U8};
constexpr ReduceKind kAllKinds[] = {ReduceKind::Sum, ReduceKind::Min, ReduceKind::Max,
                                    ReduceKind::Prod};

std::string name(DType type) {
  return dtype_name(type);
}
std::string name(ReduceKind kind) {
  constexpr const char* kNames[] = {"sum", "min", "max", "prod"};
  return kNames[static_cast<int>(kind)];
}

// Conversions written independently of the kernel: bf16 rounds to nearest even, f16 through
// the compiler's _Float16, and NaN becomes the canonical quiet NaN of the type. Where the
// compiler has no _Float16 (clang before 15 on x86 without AVX512-FP16, as on some CPUs that
// -march=native names), f16 goes through core/half.h, which
// Tensor.F16ConversionsMatchTheCompilersFloat16 checks bit for bit against _Float16 wherever a
// compiler has it.
uint16_t to_bf16(float x) {
  if (std::isnan(x)) return 0x7FC0;
  uint32_t u = std::bit_cast<uint32_t>(x);
  uint32_t lower = u & 0xFFFF, upper = u >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) ++upper;
  return static_cast<uint16_t>(upper);
}
float from_bf16(uint16_t b) {
  return std::bit_cast<float>(uint32_t(b) << 16);
}
#ifdef __FLT16_MANT_DIG__
uint16_t to_f16(float x) {
  if (std::isnan(x)) return 0x7E00;
  return std::bit_cast<uint16_t>(static_cast<_Float16>(x));
}
float from_f16(uint16_t b) {
  return static_cast<float>(std::bit_cast<_Float16>(b));
}
#else
uint16_t to_f16(float x) {
  if (std::isnan(x)) return 0x7E00;
  return loom::kernels::cpu::f32_to_f16_bits(x);
}
float from_f16(uint16_t b) {
  return loom::kernels::cpu::f16_bits_to_f32(b);
}
#endif

template <typename T>
T get(const Bytes& b, size_t i) {
  T v;
  std::memcpy(&v, b.data() + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void put(Bytes& b, size_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}

// Stores the exact value `v` as the type would hold it (one rounding; integers wrap).
void put_value(DType t, Bytes& b, size_t i, double v) {
  switch (t) {
    case DType::F32: return put<float>(b, i, static_cast<float>(v));
    case DType::F64: return put<double>(b, i, v);
    case DType::BF16: return put<uint16_t>(b, i, to_bf16(static_cast<float>(v)));
    case DType::F16: return put<uint16_t>(b, i, to_f16(static_cast<float>(v)));
    case DType::I32: return put<int32_t>(b, i, static_cast<int32_t>(static_cast<int64_t>(v)));
    case DType::I64: return put<int64_t>(b, i, static_cast<int64_t>(v));
    case DType::U8: return put<uint8_t>(b, i, static_cast<uint8_t>(static_cast<int64_t>(v)));
  }
}

Bytes filled(DType t, size_t n, const std::function<double(size_t)>& value) {
  Bytes b(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i)
    put_value(t, b, i, value(i));
  return b;
}

// Reduces into a fresh buffer, `offset` elements past an allocation's start (to vary the
// output's alignment).
Bytes run(DType t, ReduceKind k, const std::vector<Bytes>& inputs, size_t n,
          double scale = 1.0, size_t offset = 0) {
  std::vector<const void*> ptrs;
  for (const Bytes& in : inputs)
    ptrs.push_back(in.data());
  size_t s = dtype_size(t);
  Bytes out((n + offset) * s, 0xAB);
  reduce_inputs(t, k, out.data() + offset * s, ptrs.data(), ptrs.size(), n, scale);
  return Bytes(out.begin() + offset * s, out.end());
}

// Index of the first differing element, or -1.
long first_mismatch(DType t, const Bytes& a, const Bytes& b) {
  size_t s = dtype_size(t);
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i += s) {
    if (std::memcmp(a.data() + i, b.data() + i, s) != 0) return static_cast<long>(i / s);
  }
  return -1;
}

std::vector<const char*> available_isas() {
  std::vector<const char*> isas;
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (reduce_isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

// Restores the detected instruction set and the streaming threshold when a test ends.
struct IsaGuard {
  ~IsaGuard() {
    set_reduce_isa_for_testing(nullptr);
    set_reduce_streaming_threshold_for_testing(0);
  }
};

float f32_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}

TEST(ReduceOps, TypeSizes) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
}

TEST(ReduceOps, IsaSelection) {
  IsaGuard guard;
  std::string detected = reduce_isa();
  EXPECT_TRUE(detected == "avx512" || detected == "avx2" || detected == "scalar") << detected;
  EXPECT_TRUE(reduce_isa_available("scalar"));
  EXPECT_TRUE(reduce_isa_available(detected.c_str()));
  set_reduce_isa_for_testing("scalar");
  EXPECT_STREQ(reduce_isa(), "scalar");
  set_reduce_isa_for_testing(nullptr);
  EXPECT_EQ(reduce_isa(), detected);
  EXPECT_THROW(set_reduce_isa_for_testing("sse9"), loom::Error);
  EXPECT_THROW(reduce_isa_available("neon"), loom::Error);
}

// Input k holds (k + 1) + (i % 3): small integers, so sums, minima and maxima are exact in
// every type, and products are exact integers that each type rounds once (f16 overflows to
// inf, bf16 rounds, u8 wraps).
TEST(ReduceOps, ClosedFormEveryTypeAndKind) {
  IsaGuard guard;
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    for (DType t : kAllTypes) {
      for (ReduceKind k : kAllKinds) {
        for (size_t count : {1, 2, 3, 4, 5, 9}) {
          for (size_t n : {1, 17, 4099, 9000}) {
            std::vector<Bytes> inputs;
            for (size_t j = 0; j < count; ++j)
              inputs.push_back(filled(t, n, [&](size_t i) { return double(j + 1 + i % 3); }));
            Bytes want = filled(t, n, [&](size_t i) {
              double r = i % 3;
              double c = static_cast<double>(count);
              switch (k) {
                case ReduceKind::Sum: return c * (c + 1) / 2 + c * r;
                case ReduceKind::Min: return 1 + r;
                case ReduceKind::Max: return c + r;
                case ReduceKind::Prod: {
                  double p = 1;
                  for (size_t j = 0; j < count; ++j)
                    p *= double(j + 1) + r;
                  return p;
                }
              }
              return 0.0;
            });
            Bytes got = run(t, k, inputs, n);
            EXPECT_EQ(first_mismatch(t, got, want), -1)
                << isa << " " << name(t) << " " << name(k) << " count " << count << " n " << n;
          }
        }
      }
    }
  }
}

TEST(ReduceOps, SixtyFourInputs) {
  const size_t n = 1000;
  for (DType t : kAllTypes) {
    std::vector<Bytes> inputs;
    for (size_t j = 0; j < 64; ++j)
      inputs.push_back(filled(t, n, [&](size_t) { return double(j + 1); }));
    // 64 * 65 / 2 = 2080 fits every type but u8, which wraps to 2080 mod 256 = 32.
    EXPECT_EQ(first_mismatch(t, run(t, ReduceKind::Sum, inputs, n),
                             filled(t, n, [](size_t) { return 2080.0; })),
              -1)
        << name(t);
    EXPECT_EQ(first_mismatch(t, run(t, ReduceKind::Max, inputs, n),
                             filled(t, n, [](size_t) { return 64.0; })),
              -1)
        << name(t);
  }
}

// Runs a bf16 or f16 sum of single-valued inputs over n elements (vector body and tail).
float sum_half(DType t, const std::vector<float>& values, size_t n = 37) {
  std::vector<Bytes> inputs;
  for (float v : values)
    inputs.push_back(filled(t, n, [&](size_t) { return v; }));
  Bytes out = run(t, ReduceKind::Sum, inputs, n);
  for (size_t i = 1; i < n; ++i)
    EXPECT_EQ(get<uint16_t>(out, i), get<uint16_t>(out, 0)) << "element " << i;
  uint16_t bits = get<uint16_t>(out, 0);
  return t == DType::BF16 ? from_bf16(bits) : from_f16(bits);
}

// Each small addend alone is half an ulp of 1.0 (a tie that rounds to even, i.e. back to 1.0),
// so rounding after every step loses both; accumulating in f32 and rounding once keeps them.
TEST(ReduceOps, HalfPrecisionAccumulatesInF32AndRoundsOnce) {
  IsaGuard guard;
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    SCOPED_TRACE(isa);
    const float b = std::ldexp(1.0f, -8), h = std::ldexp(1.0f, -11);
    EXPECT_EQ(sum_half(DType::BF16, {1.0f, b, b}), 1.0078125f);
    EXPECT_EQ(sum_half(DType::BF16, {b, 1.0f, b}), 1.0078125f);
    EXPECT_EQ(sum_half(DType::F16, {1.0f, h, h}), 1.0009765625f);
    // More than four inputs take the blocked path; eight quarter-ulps add up to two ulps.
    const float q = std::ldexp(1.0f, -9);
    std::vector<float> many = {1.0f, q, q, q, q, q, q, q, q};
    EXPECT_EQ(sum_half(DType::BF16, many, 9000), 1.015625f);
    // Pairwise reduce_into rounds after every step and so stays at 1.0: the contrast.
    Bytes acc = filled(DType::BF16, 5, [](size_t) { return 1.0; });
    Bytes small = filled(DType::BF16, 5, [&](size_t) { return b; });
    reduce_into(DType::BF16, ReduceKind::Sum, acc.data(), small.data(), 5);
    reduce_into(DType::BF16, ReduceKind::Sum, acc.data(), small.data(), 5);
    EXPECT_EQ(from_bf16(get<uint16_t>(acc, 4)), 1.0f);
  }
}

TEST(ReduceOps, RoundsToNearestEvenWithoutFlushingSubnormals) {
  IsaGuard guard;
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    SCOPED_TRACE(isa);
    const float b = std::ldexp(1.0f, -8);
    EXPECT_EQ(sum_half(DType::BF16, {1.0f, b}), 1.0f);             // tie, even below
    EXPECT_EQ(sum_half(DType::BF16, {1.0078125f, b}), 1.015625f);  // tie, even above
    EXPECT_EQ(sum_half(DType::F16, {65504.0f, 16.0f}), INFINITY);  // tie to even: inf
    EXPECT_EQ(sum_half(DType::F16, {65504.0f, 15.0f}), 65504.0f);  // below the tie
    EXPECT_EQ(sum_half(DType::F16, {-65504.0f, -16.0f}), -INFINITY);
    // Subnormals survive (VCVTNEPS2BF16 would flush these to zero).
    const float bf16_min = from_bf16(0x0001), f16_min = from_f16(0x0001);
    EXPECT_EQ(sum_half(DType::BF16, {bf16_min, bf16_min}), from_bf16(0x0002));
    EXPECT_EQ(sum_half(DType::F16, {f16_min, f16_min, f16_min}), from_f16(0x0003));
  }
}

TEST(ReduceOps, AverageViaScale) {
  IsaGuard guard;
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      for (size_t count : {2, 4, 8}) {
        const size_t n = 5003;
        std::vector<Bytes> inputs;
        for (size_t j = 0; j < count; ++j)
          inputs.push_back(filled(t, n, [&](size_t i) { return double(j + 1) + (i % 2); }));
        // mean of (1..count) + (i % 2) = (count + 1) / 2 + (i % 2), exact for these counts.
        Bytes want = filled(t, n, [&](size_t i) { return (count + 1) / 2.0 + (i % 2); });
        EXPECT_EQ(first_mismatch(t, run(t, ReduceKind::Sum, inputs, n, 1.0 / count), want), -1)
            << isa << " " << name(t) << " count " << count;
      }
    }
  }
  // A scale that is not a power of two: f32 multiplies the f32 sum by float(scale).
  Bytes a = filled(DType::F32, 3, [](size_t i) { return 1.0 + i; });
  Bytes got = run(DType::F32, ReduceKind::Sum, {a, a, a}, 3, 1.0 / 3);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(get<float>(got, i), 3.0f * (1.0f + i) * static_cast<float>(1.0 / 3)) << i;
}

TEST(ReduceOps, IntegerWrapAround) {
  auto one = [](DType t, ReduceKind k, std::vector<double> values) {
    std::vector<Bytes> inputs;
    for (double v : values)
      inputs.push_back(filled(t, 19, [&](size_t) { return v; }));
    return run(t, k, inputs, 19);
  };
  const double i32_max = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(get<int32_t>(one(DType::I32, ReduceKind::Sum, {i32_max, 1}), 18),
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(get<int32_t>(one(DType::I32, ReduceKind::Prod, {65536, 65536}), 0), 0);
  EXPECT_EQ(get<int32_t>(one(DType::I32, ReduceKind::Prod, {-2147483648.0, -1}), 5),
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(get<int32_t>(one(DType::I32, ReduceKind::Min, {-5, 3, -7, 2}), 0), -7);
  Bytes big(19 * 8);  // INT64_MAX is not a double, so stored directly
  for (size_t i = 0; i < 19; ++i)
    put<int64_t>(big, i, std::numeric_limits<int64_t>::max());
  Bytes unit = filled(DType::I64, 19, [](size_t) { return 1.0; });
  EXPECT_EQ(get<int64_t>(run(DType::I64, ReduceKind::Sum, {big, unit}, 19), 3),
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(get<int64_t>(one(DType::I64, ReduceKind::Prod, {4294967296.0, 4294967296.0}), 0),
            0);
  EXPECT_EQ(get<uint8_t>(one(DType::U8, ReduceKind::Sum, {200, 100}), 7), 44);
  EXPECT_EQ(get<uint8_t>(one(DType::U8, ReduceKind::Prod, {16, 16}), 7), 0);
  EXPECT_EQ(get<uint8_t>(one(DType::U8, ReduceKind::Prod, {15, 17}), 7), 255);
  EXPECT_EQ(get<uint8_t>(one(DType::U8, ReduceKind::Max, {200, 100, 255, 3}), 7), 255);
  EXPECT_EQ(get<uint8_t>(one(DType::U8, ReduceKind::Sum, std::vector<double>(64, 255)), 1),
            192);  // 64 * 255 mod 256
}

TEST(ReduceOps, ScaleOnIntegersThrows) {
  for (DType t : {DType::I32, DType::I64, DType::U8}) {
    Bytes a(8 * dtype_size(t)), out(a.size());
    const void* inputs[] = {a.data(), a.data()};
    EXPECT_THROW(reduce_inputs(t, ReduceKind::Sum, out.data(), inputs, 2, 8, 0.5),
                 loom::Error)
        << name(t);
    EXPECT_NO_THROW(reduce_inputs(t, ReduceKind::Sum, out.data(), inputs, 2, 8, 1.0));
    EXPECT_THROW(scale_inplace(t, out.data(), 8, 2.0), loom::Error) << name(t);
  }
}

TEST(ReduceOps, ZeroElementsTouchNothing) {
  for (DType t : kAllTypes) {
    EXPECT_NO_THROW(reduce_inputs(t, ReduceKind::Sum, nullptr, nullptr, 0, 0));
    EXPECT_NO_THROW(reduce_into(t, ReduceKind::Max, nullptr, nullptr, 0));
  }
  EXPECT_THROW(reduce_inputs(DType::F32, ReduceKind::Sum, nullptr, nullptr, 0, 4),
               loom::Error);
}

// NaN in either operand of min/max gives NaN; every NaN result is the canonical quiet NaN.
TEST(ReduceOps, NanPropagatesAndIsCanonical) {
  IsaGuard guard;
  const float payload_nan = f32_bits(0xFFC12345);  // negative quiet NaN with a payload
  const float snan = f32_bits(0x7F800001);         // signalling NaN
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    for (ReduceKind k : kAllKinds) {
      for (std::vector<float> values : std::vector<std::vector<float>>{{payload_nan, 1.0f},
                                                                       {1.0f, payload_nan},
                                                                       {2.0f, 1.0f, snan},
                                                                       {INFINITY, -1.0f, NAN}}) {
        std::vector<Bytes> inputs;
        for (float v : values) {
          Bytes b(33 * 4);
          for (size_t i = 0; i < 33; ++i)
            put<float>(b, i, v);
          inputs.push_back(b);
        }
        Bytes out = run(DType::F32, k, inputs, 33);
        for (size_t i = 0; i < 33; ++i)
          ASSERT_EQ(get<uint32_t>(out, i), 0x7FC00000u) << isa << " " << name(k) << " " << i;
      }
    }
    // inf + -inf and 0 * inf make a NaN, also canonical; in bf16, f16 and f64 too.
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      Bytes pinf = filled(t, 21, [](size_t) { return INFINITY; });
      Bytes ninf = filled(t, 21, [](size_t) { return -INFINITY; });
      Bytes zero = filled(t, 21, [](size_t) { return 0.0; });
      Bytes want = filled(t, 21, [](size_t) { return NAN; });
      EXPECT_EQ(first_mismatch(t, run(t, ReduceKind::Sum, {pinf, ninf}, 21), want), -1) << name(t);
      EXPECT_EQ(first_mismatch(t, run(t, ReduceKind::Prod, {zero, ninf}, 21), want), -1) << name(t);
      Bytes nan_first = filled(t, 21, [](size_t) { return -NAN; });
      EXPECT_EQ(first_mismatch(t, run(t, ReduceKind::Min, {nan_first, ninf}, 21), want), -1)
          << name(t);
      EXPECT_EQ(first_mismatch(t, run(t, ReduceKind::Max, {pinf, nan_first}, 21), want), -1)
          << name(t);
    }
  }
  EXPECT_EQ(to_f16(NAN), 0x7E00);
}

// min(a, b) = a < b ? a : b and max(a, b) = a > b ? a : b: of two zeros the later input wins.
TEST(ReduceOps, SignedZerosFollowInputOrder) {
  IsaGuard guard;
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    Bytes pz = filled(DType::F32, 40, [](size_t) { return 0.0; });
    Bytes nz = filled(DType::F32, 40, [](size_t) { return -0.0; });
    auto sign = [](const Bytes& b) { return std::signbit(get<float>(b, 39)); };
    EXPECT_FALSE(sign(run(DType::F32, ReduceKind::Min, {nz, pz}, 40))) << isa;
    EXPECT_TRUE(sign(run(DType::F32, ReduceKind::Min, {pz, nz}, 40))) << isa;
    EXPECT_FALSE(sign(run(DType::F32, ReduceKind::Max, {nz, pz}, 40))) << isa;
    EXPECT_TRUE(sign(run(DType::F32, ReduceKind::Max, {pz, nz}, 40))) << isa;
    EXPECT_TRUE(sign(run(DType::F32, ReduceKind::Sum, {nz, nz}, 40))) << isa;
    EXPECT_FALSE(sign(run(DType::F32, ReduceKind::Sum, {nz, pz}, 40))) << isa;
  }
}

// Random bit patterns mixed with ordinary values and every special: NaN with payloads, both
// infinities, subnormals, both zeros.
Bytes random_input(DType t, size_t n, std::mt19937_64& rng) {
  Bytes b(n * dtype_size(t));
  std::uniform_real_distribution<double> normal(-4, 4);
  auto special = [&](uint64_t r) -> double {
    switch (r % 8) {
      case 0: return NAN;
      case 1: return INFINITY;
      case 2: return -INFINITY;
      case 3: return 0.0;
      case 4: return -0.0;
      case 5: return std::ldexp(1.0, -140) * (r % 7);  // f32 subnormal (f16/bf16: zero)
      case 6: return std::ldexp(1.0, -20) * (r % 5);   // f16 subnormal
      default: return 1e30;
    }
  };
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = rng();
    int mode = r % 10;  // 0-5 ordinary, 6-7 special, 8-9 raw bits
    r >>= 8;
    if (!is_floating(t) && mode <= 7) {
      put_value(t, b, i, std::floor(normal(rng) * 1e3));
    } else if (mode <= 7) {
      double v = mode <= 5 ? normal(rng) : special(r);
      if (t == DType::F32) {
        put<float>(b, i, static_cast<float>(v));
      } else if (t == DType::F64) {
        put<double>(b, i, v);
      } else if (t == DType::BF16) {
        put<uint16_t>(b, i, to_bf16(static_cast<float>(v)));
      } else {
        put<uint16_t>(b, i, to_f16(static_cast<float>(v)));
      }
    } else {
      std::memcpy(b.data() + i * dtype_size(t), &r, dtype_size(t));
    }
  }
  return b;
}

// An independent reference of the contract (Note [Reduction semantics] in reduce_ops.cpp).
template <typename A>
A ref_op(ReduceKind k, A a, A b) {
  switch (k) {
    case ReduceKind::Sum: return a + b;
    case ReduceKind::Prod: return a * b;
    case ReduceKind::Min: return std::isnan(a) || std::isnan(b) ? NAN : (a < b ? a : b);
    case ReduceKind::Max: return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b);
  }
  return a;
}

template <typename U, typename S>
U ref_int_op(ReduceKind k, U a, U b) {
  switch (k) {
    case ReduceKind::Sum: return static_cast<U>(a + b);
    case ReduceKind::Prod: return static_cast<U>(static_cast<uint64_t>(a) * b);
    case ReduceKind::Min: return static_cast<S>(a) < static_cast<S>(b) ? a : b;
    case ReduceKind::Max: return static_cast<S>(a) > static_cast<S>(b) ? a : b;
  }
  return a;
}

Bytes reference(DType t, ReduceKind k, const std::vector<Bytes>& in, size_t n, double scale) {
  Bytes out(n * dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    auto reduce_f32 = [&](auto load) {
      float acc = load(in[0], i);
      for (size_t j = 1; j < in.size(); ++j)
        acc = ref_op<float>(k, acc, load(in[j], i));
      return scale != 1.0 ? acc * static_cast<float>(scale) : acc;
    };
    auto reduce_int = [&]<typename U, typename S>() {
      U acc = get<U>(in[0], i);
      for (size_t j = 1; j < in.size(); ++j)
        acc = ref_int_op<U, S>(k, acc, get<U>(in[j], i));
      put<U>(out, i, acc);
    };
    switch (t) {
      case DType::F32: {
        float r = reduce_f32([](const Bytes& b, size_t i) { return get<float>(b, i); });
        put<float>(out, i, std::isnan(r) ? f32_bits(0x7FC00000) : r);
        break;
      }
      case DType::BF16:
        put<uint16_t>(out, i, to_bf16(reduce_f32([](const Bytes& b, size_t i) {
                        return from_bf16(get<uint16_t>(b, i));
                      })));
        break;
      case DType::F16:
        put<uint16_t>(out, i, to_f16(reduce_f32([](const Bytes& b, size_t i) {
                        return from_f16(get<uint16_t>(b, i));
                      })));
        break;
      case DType::F64: {
        double acc = get<double>(in[0], i);
        for (size_t j = 1; j < in.size(); ++j)
          acc = ref_op<double>(k, acc, get<double>(in[j], i));
        if (scale != 1.0) acc *= scale;
        put<uint64_t>(out, i,
                      std::isnan(acc) ? 0x7FF8000000000000ull : std::bit_cast<uint64_t>(acc));
        break;
      }
      case DType::I32: reduce_int.template operator()<uint32_t, int32_t>(); break;
      case DType::I64: reduce_int.template operator()<uint64_t, int64_t>(); break;
      case DType::U8: reduce_int.template operator()<uint8_t, uint8_t>(); break;
    }
  }
  return out;
}

TEST(ReduceOps, EveryIsaMatchesTheReferenceBitForBit) {
  IsaGuard guard;
  std::mt19937_64 rng(20240611);
  for (DType t : kAllTypes) {
    for (ReduceKind k : kAllKinds) {
      for (size_t count : {1, 2, 3, 4, 5, 8, 13}) {
        for (size_t n : {0, 1, 7, 15, 16, 17, 63, 65, 1000, 4099, 8197, 20011}) {
          std::vector<Bytes> inputs;
          for (size_t j = 0; j < count; ++j)
            inputs.push_back(random_input(t, n, rng));
          for (double scale : {1.0, 0.3}) {
            if (scale != 1.0 && !is_floating(t)) continue;
            Bytes want = reference(t, k, inputs, n, scale);
            for (const char* isa : available_isas()) {
              set_reduce_isa_for_testing(isa);
              // Ordinary stores, then non-temporal ones at two output alignments.
              for (size_t stream : {0, 1, 2}) {
                set_reduce_streaming_threshold_for_testing(stream == 0 ? 0 : 1);
                long bad =
                    first_mismatch(t, run(t, k, inputs, n, scale, stream == 2 ? 1 : 0), want);
                ASSERT_EQ(bad, -1) << isa << " " << name(t) << " " << name(k) << " count " << count
                                   << " n " << n << " scale " << scale << " stream " << stream;
              }
              set_reduce_streaming_threshold_for_testing(0);
            }
          }
        }
      }
    }
  }
}

TEST(ReduceOps, OutputMayAliasAnyInput) {
  IsaGuard guard;
  std::mt19937_64 rng(7);
  set_reduce_streaming_threshold_for_testing(1);  // aliased outputs must not stream anyway
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32}) {
      for (size_t count : {2, 3, 5, 9}) {
        const size_t n = 10007;  // several accumulator blocks and a tail
        std::vector<Bytes> inputs;
        for (size_t j = 0; j < count; ++j)
          inputs.push_back(random_input(t, n, rng));
        Bytes want = run(t, ReduceKind::Sum, inputs, n);
        for (size_t alias : {size_t{0}, count / 2, count - 1}) {
          std::vector<Bytes> copy = inputs;
          std::vector<const void*> ptrs;
          for (const Bytes& b : copy)
            ptrs.push_back(b.data());
          reduce_inputs(t, ReduceKind::Sum, copy[alias].data(), ptrs.data(), count, n);
          EXPECT_EQ(first_mismatch(t, copy[alias], want), -1)
              << isa << " " << name(t) << " count " << count << " out = inputs[" << alias << "]";
        }
      }
    }
  }
}

TEST(ReduceOps, ReduceIntoMatchesTwoInputs) {
  std::mt19937_64 rng(11);
  for (DType t : kAllTypes) {
    for (ReduceKind k : kAllKinds) {
      const size_t n = 1031;
      Bytes a = random_input(t, n, rng), b = random_input(t, n, rng);
      Bytes want = run(t, k, {a, b}, n);
      reduce_into(t, k, a.data(), b.data(), n);
      EXPECT_EQ(first_mismatch(t, a, want), -1) << name(t) << " " << name(k);
    }
  }
}

TEST(ReduceOps, ScaleInplace) {
  IsaGuard guard;
  std::mt19937_64 rng(13);
  for (const char* isa : available_isas()) {
    set_reduce_isa_for_testing(isa);
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      const size_t n = 777;
      Bytes x = filled(t, n, [](size_t i) { return double(i % 50) - 25; });
      scale_inplace(t, x.data(), n, 0.5);
      EXPECT_EQ(
          first_mismatch(t, x, filled(t, n, [](size_t i) { return (double(i % 50) - 25) / 2; })),
          -1)
          << isa << " " << name(t);
      Bytes r = random_input(t, n, rng);
      Bytes want = reference(t, ReduceKind::Sum, {r}, n, 3.0);
      scale_inplace(t, r.data(), n, 3.0);
      EXPECT_EQ(first_mismatch(t, r, want), -1) << isa << " " << name(t);
    }
    // bf16 goes through f32 and rounds once: (1 + 2^-7) * 3 = 3 + 1.5 ulp -> even: 3.03125.
    Bytes b = filled(DType::BF16, 20, [](size_t) { return 1.0078125; });
    scale_inplace(DType::BF16, b.data(), 20, 3.0);
    EXPECT_EQ(from_bf16(get<uint16_t>(b, 19)), 3.03125f) << isa;
  }
  Bytes same = filled(DType::F32, 5, [](size_t i) { return i + 0.25; });
  Bytes before = same;
  scale_inplace(DType::F32, same.data(), 5, 1.0);
  EXPECT_EQ(same, before);
}

}  // namespace
}  // namespace loom::kernels::cpu
