#pragma once
// Rotary position embedding's CUDA kernels, the twins of kernels/cpu/rotary.h (the same
// contracts and bits; the op: Note [Rotary positions in one pass], tensor/ops/rotary.cpp).
// x's dtype is f32, f64, bf16 or f16; the tables' is x's or f32. One launch each way.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace loom::kernels::cuda {

void rotary_forward(DType dtype, DType table_dtype, const void* x, int64_t batch, int64_t heads,
                    int64_t time, int64_t dim, int64_t stride_b, int64_t stride_h, int64_t stride_t,
                    const void* cos, const void* sin, void* y, cudaStream_t stream);
void rotary_backward(DType dtype, DType table_dtype, const void* dy, int64_t rows, int64_t time,
                     int64_t dim, const void* cos, const void* sin, void* dx, cudaStream_t stream);

}  // namespace loom::kernels::cuda
