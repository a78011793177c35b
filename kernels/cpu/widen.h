#pragma once
// Elements a CPU kernel stores in one type and computes in another: bf16 and f16 are computed
// in f32, widened exactly on load and rounded to nearest even once on store (the conversions
// of cast(), core/dtype.h and core/half.h), the arithmetic of CUDA's kernels. A kernel
// templated on its storage type S and written in compute_of<S> gives, for a 16-bit S, the
// bits that widening its inputs to f32 tensors, running the f32 kernel and casting the result
// would give, without the widened copies; for f32 and f64 both conversions are the identity.

#include <type_traits>

#include "core/dtype.h"
#include "core/half.h"

namespace loom::kernels::cpu {

template <typename S>
inline constexpr bool kIs16BitFloat = std::is_same_v<S, BFloat16> || std::is_same_v<S, Half>;

template <typename S>
using compute_of = std::conditional_t<kIs16BitFloat<S>, float, S>;

template <typename S>
inline compute_of<S> widen(S v) {
  if constexpr (std::is_same_v<S, BFloat16>) return bf16_bits_to_float(v.bits);
  else if constexpr (std::is_same_v<S, Half>) return f16_bits_to_f32(v.bits);
  else return v;
}

template <typename S>
inline S narrow(compute_of<S> v) {
  if constexpr (std::is_same_v<S, BFloat16>) return {float_to_bf16_bits(v)};
  else if constexpr (std::is_same_v<S, Half>) return {f32_to_f16_bits(v)};
  else return v;
}

}  // namespace loom::kernels::cpu
