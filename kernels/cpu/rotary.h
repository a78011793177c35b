#pragma once
// Rotary position embedding's kernels on the CPU (the op and its numerics: Note [Rotary
// positions in one pass], tensor/ops/rotary.cpp). S is x's storage type (float, double,
// BFloat16, Half), C the tables' (S's own, or float); arithmetic in compute_of<S>
// (kernels/cpu/widen.h).

#include <cstdint>

namespace loom::kernels::cpu {

// y[b, h, t, :] = x[b, h, t, :] * cos[t] + rotate_half(x[b, h, t, :]) * sin[t], for x and y
// of sizes [batch, heads, time, dim] with strides (x_b, x_h, x_t, 1) and (y_b, y_h, y_t, 1)
// (Llama's q and k are views of a [batch, time, heads, dim] projection, and y keeps x's
// layout), and contiguous cos and sin [time, dim] (dim even).
template <typename S, typename C>
void rotary_forward(const S* x, int64_t batch, int64_t heads, int64_t time, int64_t dim,
                    int64_t x_b, int64_t x_h, int64_t x_t, const C* cos, const C* sin, S* y,
                    int64_t y_b, int64_t y_h, int64_t y_t);
// dx of the above, dy and dx laid out as x and y are (strides (b, h, t, 1) each).
template <typename S, typename C>
void rotary_backward(const S* dy, int64_t batch, int64_t heads, int64_t time, int64_t dim,
                     int64_t dy_b, int64_t dy_h, int64_t dy_t, const C* cos, const C* sin, S* dx,
                     int64_t dx_b, int64_t dx_h, int64_t dx_t);

}  // namespace loom::kernels::cpu
