#pragma once
// Rotary position embedding's CUDA kernels, the twins of kernels/cpu/rotary.h (the same
// contracts and bits; the op: Note [Rotary positions in one pass], tensor/ops/rotary.cpp).
// x's dtype is f32, f64, bf16 or f16; the tables' is x's or f32. One launch each way.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace loom::kernels::cuda {

// Strides (b, h, t) of each [batch, heads, time, dim] operand; the last dim's stride is 1.
struct RotaryLayout {
  int64_t b, h, t;
};

void rotary_forward(DType dtype, DType table_dtype, const void* x, RotaryLayout x_layout,
                    int64_t batch, int64_t heads, int64_t time, int64_t dim, const void* cos,
                    const void* sin, void* y, RotaryLayout y_layout, cudaStream_t stream);
void rotary_backward(DType dtype, DType table_dtype, const void* dy, RotaryLayout dy_layout,
                     int64_t batch, int64_t heads, int64_t time, int64_t dim, const void* cos,
                     const void* sin, void* dx, RotaryLayout dx_layout, cudaStream_t stream);

}  // namespace loom::kernels::cuda
