#pragma once
// Reduction kernels of the communication layer, shared with tensor ops.
// Vectorised for AVX-512 and AVX2 with run-time selection and a scalar fallback; every
// variant produces bitwise the same results (elementwise, in the given input order).

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace loom::kernels::cpu {

enum class ReduceKind { Sum, Min, Max, Prod };

// out[i] = inputs[0][i] op inputs[1][i] op ... op inputs[k-1][i], combined left to right
// (inputs[0] first). bf16/f16 accumulate in f32 and round once at the end. `out` may alias
// any input. With `scale` != 1 (floating types only) the result is multiplied by it before
// rounding (Avg = Sum with scale 1/n).
void reduce_inputs(DType type, ReduceKind kind, void* out, const void* const* inputs,
                   size_t count, size_t n, double scale = 1.0);

// dst[i] = dst[i] op src[i] (two-input form of reduce_inputs, same rounding).
void reduce_into(DType type, ReduceKind kind, void* dst, const void* src, size_t n);

// dst[i] *= scale (floating types only; bf16/f16 through f32).
void scale_inplace(DType type, void* dst, size_t n, double scale);

// Which instruction set reduce_inputs uses on this machine: "avx512", "avx2" or "scalar".
const char* reduce_isa();

}  // namespace loom::kernels::cpu
