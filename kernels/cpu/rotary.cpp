#include "kernels/cpu/rotary.h"

#include "core/dtype.h"
#include "core/half.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/widen.h"

namespace loom::kernels::cpu {
namespace {

// A table's value as x's dtype holds it (Hugging Face's cos.to(x.dtype)), in S's arithmetic.
template <typename S, typename C>
compute_of<S> table_value(C v) {
  return widen<S>(narrow<S>(static_cast<compute_of<S>>(widen<C>(v))));
}

int64_t rows_per_task(int64_t dim) {
  return kMinParallelElements / (dim > 0 ? dim : 1) + 1;
}

}  // namespace

// Each product and the sum rounded to S, as mul, mul and add round them (this file is compiled
// without FMA contraction: kernels/CMakeLists.txt).
template <typename S, typename C>
void rotary_forward(const S* x, int64_t batch, int64_t heads, int64_t time, int64_t dim,
                    int64_t x_b, int64_t x_h, int64_t x_t, const C* cos, const C* sin, S* y,
                    int64_t y_b, int64_t y_h, int64_t y_t) {
  const int64_t half = dim / 2;
  parallel_for(batch * heads * time, rows_per_task(dim), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t t = r % time, h = r / time % heads, b = r / time / heads;
      const S* in = x + b * x_b + h * x_h + t * x_t;
      S* out = y + b * y_b + h * y_h + t * y_t;
      for (int64_t d = 0; d < dim; ++d) {
        const compute_of<S> rotated = d < half ? -widen<S>(in[d + half]) : widen<S>(in[d - half]);
        const S a = narrow<S>(widen<S>(in[d]) * table_value<S>(cos[t * dim + d]));
        const S b2 = narrow<S>(rotated * table_value<S>(sin[t * dim + d]));
        out[d] = narrow<S>(widen<S>(a) + widen<S>(b2));
      }
    }
  });
}

// dx[d] = dy[d] cos[d] + (d < half ? dy[d + half] sin[d + half] : -dy[d - half] sin[d - half]),
// each product and the sum rounded in compute_of<S>, the result rounded to S once.
template <typename S, typename C>
void rotary_backward(const S* dy, int64_t batch, int64_t heads, int64_t time, int64_t dim,
                     int64_t dy_b, int64_t dy_h, int64_t dy_t, const C* cos, const C* sin, S* dx,
                     int64_t dx_b, int64_t dx_h, int64_t dx_t) {
  const int64_t half = dim / 2;
  parallel_for(batch * heads * time, rows_per_task(dim), [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const int64_t t = r % time, h = r / time % heads, b = r / time / heads;
      const S* g = dy + b * dy_b + h * dy_h + t * dy_t;
      S* out = dx + b * dx_b + h * dx_h + t * dx_t;
      const C* c = cos + t * dim;
      const C* s = sin + t * dim;
      for (int64_t d = 0; d < dim; ++d) {
        const compute_of<S> other = d < half
                                        ? widen<S>(g[d + half]) * table_value<S>(s[d + half])
                                        : -(widen<S>(g[d - half]) * table_value<S>(s[d - half]));
        out[d] = narrow<S>(widen<S>(g[d]) * table_value<S>(c[d]) + other);
      }
    }
  });
}

#define LOOM_INSTANTIATE(S, C)                                                                    \
  template void rotary_forward<S, C>(const S*, int64_t, int64_t, int64_t, int64_t, int64_t,       \
                                     int64_t, int64_t, const C*, const C*, S*, int64_t, int64_t,  \
                                     int64_t);                                                    \
  template void rotary_backward<S, C>(const S*, int64_t, int64_t, int64_t, int64_t, int64_t,      \
                                      int64_t, int64_t, const C*, const C*, S*, int64_t, int64_t, \
                                      int64_t);
LOOM_INSTANTIATE(float, float)
LOOM_INSTANTIATE(double, double)
LOOM_INSTANTIATE(double, float)
LOOM_INSTANTIATE(BFloat16, BFloat16)
LOOM_INSTANTIATE(BFloat16, float)
LOOM_INSTANTIATE(Half, Half)
LOOM_INSTANTIATE(Half, float)
#undef LOOM_INSTANTIATE

}  // namespace loom::kernels::cpu
