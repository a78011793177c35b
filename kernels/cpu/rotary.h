#pragma once
// Rotary position embedding's kernels on the CPU (the op and its numerics: Note [Rotary
// positions in one pass], tensor/ops/rotary.cpp). S is x's storage type (float, double,
// BFloat16, Half), C the tables' (S's own, or float); arithmetic in compute_of<S>
// (kernels/cpu/widen.h).

#include <cstdint>

namespace loom::kernels::cpu {

// y[b, h, t, :] = x[b, h, t, :] * cos[t] + rotate_half(x[b, h, t, :]) * sin[t], for x of
// sizes [batch, heads, time, dim] with strides (stride_b, stride_h, stride_t, 1) and
// contiguous y, cos and sin [time, dim] (dim even).
template <typename S, typename C>
void rotary_forward(const S* x, int64_t batch, int64_t heads, int64_t time, int64_t dim,
                    int64_t stride_b, int64_t stride_h, int64_t stride_t, const C* cos,
                    const C* sin, S* y);
// dx of the above for contiguous dy and dx [rows, time, dim] (rows = batch * heads).
template <typename S, typename C>
void rotary_backward(const S* dy, int64_t rows, int64_t time, int64_t dim, const C* cos,
                     const C* sin, S* dx);

}  // namespace loom::kernels::cpu
