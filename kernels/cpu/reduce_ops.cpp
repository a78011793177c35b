#include "kernels/cpu/reduce_ops.h"

// GCC 12 reports a false -Wmaybe-uninitialized inside its own AVX-512 header when its
// intrinsics are inlined (the self-initialised placeholder of _mm512_undefined_ps); the state
// that counts is the one at the header's lines, so the pragma wraps the include.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <cpuid.h>

#include <atomic>
#include <bit>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "core/half.h"
#include "core/tags.h"
#include "kernels/cpu/reduce_ops_impl.h"

// Note [Reduction semantics]
// Every instruction set computes the same thing, bit for bit:
// - Elementwise, left to right: acc = in0; acc = acc op in1; ...; then, with scale != 1,
//   acc = acc * scale (in the accumulator type); then one rounding to the element type.
//   bf16 and f16 accumulate in f32 (bf16 rounds to nearest even; f16 through the hardware or
//   half.h's conversion, also nearest even, with overflow to inf and subnormal results kept).
// - Min and max propagate NaN: if either operand is NaN the result is NaN; otherwise
//   min(a, b) = a < b ? a : b and max(a, b) = a > b ? a : b (the x86 MINPS/MAXPS rule), so
//   min(-0, +0) is +0 and min(+0, -0) is -0: the later input wins a tie of zeros.
// - Every NaN result is the canonical quiet NaN (f32 0x7FC00000, f64 0x7FF8000000000000,
//   bf16 0x7FC0, f16 0x7E00): which operand's payload an x86 add returns depends on the
//   compiler's operand order, so payloads cannot be kept deterministic across variants.
// - Integers wrap around (two's complement); min and max are the plain ones.

namespace loom::kernels::cpu {
namespace {

// Element types as they sit in memory; the wrappers only select overloads.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

constexpr uint32_t kNanF32 = 0x7FC00000u;
constexpr uint64_t kNanF64 = 0x7FF8000000000000ull;
constexpr uint16_t kNanBf16 = 0x7FC0;
constexpr uint16_t kNanF16 = 0x7E00;

inline float bf16_to_f32(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then truncate.
inline uint16_t f32_to_bf16(float x) {
  if (x != x) return kNanBf16;
  uint32_t bits = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

inline float f16_to_f32(uint16_t bits) {
  return f16_bits_to_f32(bits);
}

inline uint16_t f32_to_f16(float x) {
  if (x != x) return kNanF16;
  return f32_to_f16_bits(x);
}

template <typename T>
inline T min_nan(T a, T b) {
  return a != a ? a : (a < b ? a : b);
}
template <typename T>
inline T max_nan(T a, T b) {
  return a != a ? a : (a > b ? a : b);
}

// One-lane traits of the f32 family: the scalar variant, and the tails of the vector ones.
struct ScalarF32 {
  using F = float;
  using Acc = float;
  using Scalar = ScalarF32;
  static constexpr size_t kWidth = 1;
  static constexpr bool kFloating = true;

  static float set1(float x) { return x; }
  static float load_acc(const float* p) { return *p; }
  static void store_acc(float* p, float x) { *p = x; }
  static float load(const float* p) { return *p; }
  static float load(const Bf16* p) { return bf16_to_f32(p->bits); }
  static float load(const Half* p) { return f16_to_f32(p->bits); }
  static void store(float* p, float x) { *p = x != x ? std::bit_cast<float>(kNanF32) : x; }
  static void store(Bf16* p, float x) { p->bits = f32_to_bf16(x); }
  static void store(Half* p, float x) { p->bits = f32_to_f16(x); }
  static float add(float a, float b) { return a + b; }
  static float mul(float a, float b) { return a * b; }
  static float min(float a, float b) { return min_nan(a, b); }
  static float max(float a, float b) { return max_nan(a, b); }
};

// The type integer sums and products are computed in (unsigned, so that they wrap).
template <typename T, bool = std::is_integral_v<T>>
struct Wrapping {
  using type = T;
};
template <typename T>
struct Wrapping<T, true> {
  using type = std::make_unsigned_t<T>;
};

// One-lane traits of f64 and the integers, which have a single (scalar) variant. Sums and
// products of integers go through the unsigned type so that they wrap instead of overflowing.
template <typename T>
struct ScalarPlain {
  using F = T;
  using Acc = T;
  using Scalar = ScalarPlain;
  using Wide = typename Wrapping<T>::type;
  static constexpr size_t kWidth = 1;
  static constexpr bool kFloating = std::is_floating_point_v<T>;

  static T set1(T x) { return x; }
  static T load_acc(const T* p) { return *p; }
  static void store_acc(T* p, T x) { *p = x; }
  static T load(const T* p) { return *p; }
  static void store(T* p, T x) {
    if constexpr (kFloating) {
      *p = x != x ? std::bit_cast<T>(kNanF64) : x;
    } else {
      *p = x;
    }
  }
  static T add(T a, T b) { return static_cast<T>(static_cast<Wide>(a) + static_cast<Wide>(b)); }
  static T mul(T a, T b) {
    // uint8_t promotes to int; its product (at most 255 * 255) cannot overflow.
    return static_cast<T>(static_cast<Wide>(a) * static_cast<Wide>(b));
  }
  static T min(T a, T b) { return min_nan(a, b); }
  static T max(T a, T b) { return max_nan(a, b); }
};

// Note [One kernel, three instruction sets]
// The loops live once, in reduce_ops_simd_impl.h, templated on a traits type; this file
// includes them three times, in namespaces scalar_isa, avx2_isa and avx512_isa, the last two
// inside `#pragma GCC target` regions so that the templates instantiated there are compiled
// for that instruction set whatever -march the build uses (GCC gives functions declared in
// such a region, template instantiations included, the region's target; clang's equivalent
// is `#pragma clang attribute` with a target attribute on every function of the region).
// The variant is picked at run time from __builtin_cpu_supports, so a build without
// -march=native still runs AVX-512 where the machine has it. "scalar" means no intrinsics:
// it is compiled for the build's -march, which GCC auto-vectorises (under -march=native f32
// runs as fast as the intrinsics; bf16 and f16 do not). f64 and the integers have only the
// scalar variant.
//
// Note [Only the host's instruction sets]
// A sanitized build (LOOM_SANITIZE) is compiled for its build machine (-march=native) and
// runs only there, its tests: it compiles only the vector variants that machine has
// (LOOM_REDUCE_HOST_ISAS_ONLY, set by kernels/CMakeLists.txt), which -march=native's macros
// tell. On an AVX2 machine the AVX-512 variant could never run there, and it was half of this
// file's compilation, the longest of those builds (docs/reliability.md). A variant not
// compiled is reported unavailable, as on a machine without it.
#if !LOOM_REDUCE_HOST_ISAS_ONLY || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define LOOM_REDUCE_AVX2 1
#else
#define LOOM_REDUCE_AVX2 0
#endif
#if !LOOM_REDUCE_HOST_ISAS_ONLY || \
    (LOOM_REDUCE_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__))
#define LOOM_REDUCE_AVX512 1
#else
#define LOOM_REDUCE_AVX512 0
#endif

namespace scalar_isa {
template <class E>
using Ops = ScalarF32;
#include "kernels/cpu/reduce_ops_simd_impl.h"
}  // namespace scalar_isa

// The vector variants: `Math` is f32 arithmetic on one register, `Ops<E>` adds the loads and
// stores of element type E. bf16 is held as two f32 registers, the even and the odd elements
// of a 64-byte (or 32-byte) load: widening is a shift and a mask, narrowing a word blend, and
// no lane-crossing shuffle is needed (the elementwise arithmetic does not care about order).

#if LOOM_REDUCE_AVX2
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2_isa {

struct Math {
  using F = __m256;
  using Acc = float;
  using Scalar = ScalarF32;
  static constexpr bool kFloating = true;

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F is_nan(F x) { return _mm256_cmp_ps(x, x, _CMP_UNORD_Q); }
  static F canonical(F x) {
    return _mm256_blendv_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(kNanF32)), is_nan(x));
  }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  // MINPS returns its second operand when either is NaN; the blend makes a NaN `a` win too.
  static F min(F a, F b) { return _mm256_blendv_ps(_mm256_min_ps(a, b), a, is_nan(a)); }
  static F max(F a, F b) { return _mm256_blendv_ps(_mm256_max_ps(a, b), a, is_nan(a)); }
};

template <class E>
struct Ops;

template <>
struct Ops<float> : Math {
  static constexpr size_t kWidth = 8;
  static constexpr int kUnroll = 4;
  static F load_acc(const float* p) { return _mm256_loadu_ps(p); }
  static void store_acc(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, canonical(x)); }
  static void stream(float* p, F x) { _mm256_stream_ps(p, canonical(x)); }
};

template <>
struct Ops<Half> : Ops<float> {
  static F load(const Half* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static __m128i narrow(F x) {
    return _mm256_cvtps_ph(canonical(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void store(Half* p, F x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow(x)); }
  static void stream(Half* p, F x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), narrow(x)); }
};

struct Pair {
  __m256 even, odd;
};

template <>
struct Ops<Bf16> {
  using F = Pair;
  using Acc = float;
  using Scalar = ScalarF32;
  static constexpr bool kFloating = true;
  static constexpr size_t kWidth = 16;
  static constexpr int kUnroll = 2;  // of register pairs

  static F set1(float x) { return {Math::set1(x), Math::set1(x)}; }
  static F load_acc(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store_acc(float* p, F x) {
    _mm256_storeu_ps(p, x.even);
    _mm256_storeu_ps(p + 8, x.odd);
  }
  static F load(const Bf16* p) {
    __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(x, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(0xFFFF0000u)))};
  }
  // Round to nearest even in the upper 16 bits (NaN made canonical first, which survives).
  static __m256i round(__m256 x) {
    __m256i bits = _mm256_castps_si256(Math::canonical(x));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    return _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  }
  static __m256i narrow(F x) {
    return _mm256_blend_epi16(_mm256_srli_epi32(round(x.even), 16), round(x.odd), 0xAA);
  }
  static void store(Bf16* p, F x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(x)); }
  static void stream(Bf16* p, F x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), narrow(x));
  }
  static F add(F a, F b) { return {Math::add(a.even, b.even), Math::add(a.odd, b.odd)}; }
  static F mul(F a, F b) { return {Math::mul(a.even, b.even), Math::mul(a.odd, b.odd)}; }
  static F min(F a, F b) { return {Math::min(a.even, b.even), Math::min(a.odd, b.odd)}; }
  static F max(F a, F b) { return {Math::max(a.even, b.even), Math::max(a.odd, b.odd)}; }
};

#include "kernels/cpu/reduce_ops_simd_impl.h"
}  // namespace avx2_isa
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // LOOM_REDUCE_AVX2

#if LOOM_REDUCE_AVX512
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")
#endif
namespace avx512_isa {

struct Math {
  using F = __m512;
  using Acc = float;
  using Scalar = ScalarF32;
  static constexpr bool kFloating = true;

  static F set1(float x) { return _mm512_set1_ps(x); }
  static __mmask16 is_nan(F x) { return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q); }
  static F canonical(F x) {
    return _mm512_mask_mov_ps(x, is_nan(x), _mm512_castsi512_ps(_mm512_set1_epi32(kNanF32)));
  }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  // VMINPS in the lanes where `a` is a number (it returns b when b is NaN); a NaN `a` stays.
  static F min(F a, F b) { return _mm512_mask_min_ps(a, ~is_nan(a), a, b); }
  static F max(F a, F b) { return _mm512_mask_max_ps(a, ~is_nan(a), a, b); }
};

template <class E>
struct Ops;

template <>
struct Ops<float> : Math {
  static constexpr size_t kWidth = 16;
  static constexpr int kUnroll = 4;
  static F load_acc(const float* p) { return _mm512_loadu_ps(p); }
  static void store_acc(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, canonical(x)); }
  static void stream(float* p, F x) { _mm512_stream_ps(p, canonical(x)); }
};

template <>
struct Ops<Half> : Ops<float> {
  static F load(const Half* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m256i narrow(F x) {
    return _mm512_cvtps_ph(canonical(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static void store(Half* p, F x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow(x)); }
  static void stream(Half* p, F x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), narrow(x));
  }
};

struct Pair {
  __m512 even, odd;
};

// Integer rounding rather than VCVTNEPS2BF16 (AVX512_BF16), which flushes subnormals.
template <>
struct Ops<Bf16> {
  using F = Pair;
  using Acc = float;
  using Scalar = ScalarF32;
  static constexpr bool kFloating = true;
  static constexpr size_t kWidth = 32;
  static constexpr int kUnroll = 2;  // of register pairs

  static F set1(float x) { return {Math::set1(x), Math::set1(x)}; }
  static F load_acc(const float* p) { return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)}; }
  static void store_acc(float* p, F x) {
    _mm512_storeu_ps(p, x.even);
    _mm512_storeu_ps(p + 16, x.odd);
  }
  static F load(const Bf16* p) {
    __m512i x = _mm512_loadu_si512(p);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(0xFFFF0000u)))};
  }
  // Round to nearest even in the upper 16 bits (NaN made canonical first, which survives).
  static __m512i round(__m512 x) {
    __m512i bits = _mm512_castps_si512(Math::canonical(x));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  }
  static __m512i narrow(F x) {
    return _mm512_mask_blend_epi16(0xAAAAAAAA, _mm512_srli_epi32(round(x.even), 16), round(x.odd));
  }
  static void store(Bf16* p, F x) { _mm512_storeu_si512(p, narrow(x)); }
  static void stream(Bf16* p, F x) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), narrow(x));
  }
  static F add(F a, F b) { return {Math::add(a.even, b.even), Math::add(a.odd, b.odd)}; }
  static F mul(F a, F b) { return {Math::mul(a.even, b.even), Math::mul(a.odd, b.odd)}; }
  static F min(F a, F b) { return {Math::min(a.even, b.even), Math::min(a.odd, b.odd)}; }
  static F max(F a, F b) { return {Math::max(a.even, b.even), Math::max(a.odd, b.odd)}; }
};

#include "kernels/cpu/reduce_ops_simd_impl.h"
}  // namespace avx512_isa
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // LOOM_REDUCE_AVX512

enum class Isa { Scalar, Avx2, Avx512 };
constexpr const char* kIsaNames[] = {"scalar", "avx2", "avx512"};

using F32FamilyKernel = void (*)(DType, ReduceKind, void*, const void* const*, size_t, size_t,
                                 float, bool, bool);
// Indexed by Isa; null for a variant this build does not compile.
constexpr F32FamilyKernel kF32FamilyKernels[] = {
    scalar_isa::reduce_f32_family,
#if LOOM_REDUCE_AVX2
    avx2_isa::reduce_f32_family,
#else
    nullptr,
#endif
#if LOOM_REDUCE_AVX512
    avx512_isa::reduce_f32_family,
#else
    nullptr,
#endif
};

// F16C from CPUID (leaf 1, ECX): not every compiler's __builtin_cpu_supports knows "f16c".
bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool isa_supported(Isa isa) {
  if (kF32FamilyKernels[static_cast<int>(isa)] == nullptr) return false;
  __builtin_cpu_init();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case Isa::Avx512:
      return isa_supported(Isa::Avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
}

Isa detect_isa() {
  if (isa_supported(Isa::Avx512)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

std::atomic<Isa>& selected_isa() {
  static std::atomic<Isa> isa{detect_isa()};
  return isa;
}

Isa parse_isa(const char* name) {
  for (int i = 0; i < 3; ++i) {
    if (std::strcmp(name, kIsaNames[i]) == 0) return static_cast<Isa>(i);
  }
  tag::kKernelsReduceOps.fail("unknown instruction set '", name,
                              "'; expected avx512, avx2 or scalar");
}

// Note [Streaming stores]. When the inputs and the output together exceed the last-level
// cache, the output would be evicted before anyone reads it again, and writing it with
// ordinary stores first reads every line of it from memory (read for ownership): a quarter of
// the traffic of a two-input reduction (64 MiB f32 on the AMD EPYC build machine: 21 -> 32
// GB/s). The threshold is a fixed 32 MiB, about the L3 one core can reach on current server
// parts (AMD's per-CCD L3; sysconf(_SC_LEVEL3_CACHE_SIZE) reports 320 MiB there, the whole
// socket's). An output that is also an input was just read, so it keeps ordinary stores.
constexpr size_t kStreamingBytes = size_t{32} << 20;
std::atomic<size_t> g_streaming_threshold{kStreamingBytes};

bool use_streaming_stores(const void* out, const void* const* inputs, size_t count, size_t n,
                          size_t element_size) {
  if (reinterpret_cast<uintptr_t>(out) % element_size != 0) return false;
  for (size_t k = 0; k < count; ++k) {
    if (inputs[k] == out) return false;
  }
  return (count + 1) * n * element_size >= g_streaming_threshold.load(std::memory_order_relaxed);
}

// Note [Tiny sums]
// A sum of at most kTinyBytes (a loss, a flag, a norm: what the collectives' fast boxes
// carry) is a few additions, and the vector kernels' dispatch and masked loads cost more
// than that: 12 of the 200 ns of a two-rank 8-byte allreduce. So such sums are added here,
// one element at a time in input order, with the vector kernels' bits: each addition rounded
// to the type (no contraction is possible), a NaN made the canonical quiet NaN.
constexpr size_t kTinyBytes = 64;

template <typename T, typename Bits, Bits kCanonicalNan>
void sum_tiny(void* out, const void* const* inputs, size_t count, size_t n) {
  // Element by element: out may alias an input, and element i of it is written only after
  // every input's element i was read. (Fixed-size copies: no call to memmove.)
  auto load = [](const void* from, size_t i) {
    T value;
    std::memcpy(&value, static_cast<const char*>(from) + i * sizeof(T), sizeof(T));
    return value;
  };
  for (size_t i = 0; i < n; ++i) {
    T acc = load(inputs[0], i);
    for (size_t k = 1; k < count; ++k)
      acc += load(inputs[k], i);
    if (acc != acc) acc = std::bit_cast<T>(kCanonicalNan);
    std::memcpy(static_cast<char*>(out) + i * sizeof(T), &acc, sizeof(T));
  }
}

}  // namespace

void reduce_inputs(DType type, ReduceKind kind, void* out, const void* const* inputs,
                   size_t count, size_t n, double scale) {
  bool scaled = scale != 1.0;
  if (scaled && !is_floating(type)) {
    tag::kKernelsReduceOps.fail("reduce_inputs: scale ", scale, " given for integer type ",
                                dtype_name(type), "; scaling applies to floating types only");
  }
  if (n == 0) return;
  if (count == 0) {
    tag::kKernelsReduceOps.fail("reduce_inputs: count is 0; expected 1 or more inputs");
  }
  if (kind == ReduceKind::Sum && !scaled && n * dtype_size(type) <= kTinyBytes) {
    if (type == DType::F32) return sum_tiny<float, uint32_t, 0x7FC00000u>(out, inputs, count, n);
    if (type == DType::F64) {
      return sum_tiny<double, uint64_t, 0x7FF8000000000000ull>(out, inputs, count, n);
    }
  }
  switch (type) {
    case DType::F32:
    case DType::BF16:
    case DType::F16:
      return kF32FamilyKernels[static_cast<int>(selected_isa().load(std::memory_order_relaxed))](
          type, kind, out, inputs, count, n, static_cast<float>(scale), scaled,
          use_streaming_stores(out, inputs, count, n, dtype_size(type)));
    case DType::F64:
      return scalar_isa::reduce_typed<ScalarPlain<double>, double>(kind, out, inputs, count, n,
                                                                   scale, scaled, false);
    case DType::I32:
      return scalar_isa::reduce_typed<ScalarPlain<int32_t>, int32_t>(kind, out, inputs, count, n, 1,
                                                                     false, false);
    case DType::I64:
      return scalar_isa::reduce_typed<ScalarPlain<int64_t>, int64_t>(kind, out, inputs, count, n, 1,
                                                                     false, false);
    case DType::U8:
      return scalar_isa::reduce_typed<ScalarPlain<uint8_t>, uint8_t>(kind, out, inputs, count, n, 1,
                                                                     false, false);
  }
}

void reduce_into(DType type, ReduceKind kind, void* dst, const void* src, size_t n) {
  const void* inputs[2] = {dst, src};
  reduce_inputs(type, kind, dst, inputs, 2, n);
}

void scale_inplace(DType type, void* dst, size_t n, double scale) {
  if (!is_floating(type)) {
    tag::kKernelsReduceOps.fail("scale_inplace: type ", dtype_name(type),
                                " is not floating; expected f32, f64, bf16 or f16");
  }
  if (scale == 1.0) return;
  const void* inputs[1] = {dst};
  reduce_inputs(type, ReduceKind::Sum, dst, inputs, 1, n, scale);
}

const char* reduce_isa() {
  return kIsaNames[static_cast<int>(selected_isa().load(std::memory_order_relaxed))];
}

bool reduce_isa_available(const char* isa) {
  return isa_supported(parse_isa(isa));
}

void set_reduce_streaming_threshold_for_testing(size_t bytes) {
  g_streaming_threshold.store(bytes == 0 ? kStreamingBytes : bytes, std::memory_order_relaxed);
}

void set_reduce_isa_for_testing(const char* isa) {
  Isa chosen = isa == nullptr ? detect_isa() : parse_isa(isa);
  if (!isa_supported(chosen)) {
    tag::kKernelsReduceOps.fail("instruction set ", isa, " is not available on this machine");
  }
  selected_isa().store(chosen, std::memory_order_relaxed);
}

}  // namespace loom::kernels::cpu
