#include "kernels/cpu/attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cpu/thread_pool.h"

namespace loom::kernels::cpu {

namespace {
inline int64_t at(const int64_t* strides, int64_t b, int64_t h) {
  return b * strides[0] + h * strides[1];
}
}  // namespace

template <typename T>
void causal_attention_forward(const AttentionShape& s, const T* q, const int64_t* q_strides,
                              const T* k, const int64_t* k_strides, const T* v,
                              const int64_t* v_strides, T* out, const int64_t* out_strides,
                              T* probs) {
  const int64_t tt = s.time * s.time;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  parallel_rows(s.batch * s.heads, tt, [&](int64_t first, int64_t last) {
    for (int64_t bh = first; bh < last; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      T* p = probs + bh * tt;
      gemm<T>(false, true, s.time, s.time, s.head_dim, q + at(q_strides, b, h), q_strides[2],
              k + at(k_strides, b, h), k_strides[2], p, s.time, false);
      for (int64_t i = 0; i < tt; ++i)
        p[i] *= scale;
      softmax_forward<T>(p, p, s.time, s.time, s.time);
      gemm<T>(false, false, s.time, s.head_dim, s.time, p, s.time, v + at(v_strides, b, h),
              v_strides[2], out + at(out_strides, b, h), out_strides[2], false);
    }
  });
}

template <typename T>
void causal_attention_backward(const AttentionShape& s, const T* dout, const int64_t* dout_strides,
                               const T* q, const int64_t* q_strides, const T* k,
                               const int64_t* k_strides, const T* v, const int64_t* v_strides,
                               const T* probs, T* dq, const int64_t* dq_strides, T* dk,
                               const int64_t* dk_strides, T* dv, const int64_t* dv_strides) {
  const int64_t tt = s.time * s.time;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  parallel_rows(s.batch * s.heads, tt, [&](int64_t first, int64_t last) {
    std::vector<T> dscores(static_cast<size_t>(tt));
    for (int64_t bh = first; bh < last; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      const T* p = probs + bh * tt;
      const T* dO = dout + at(dout_strides, b, h);
      const int64_t ldo = dout_strides[2];
      // dV = P^T dO
      gemm<T>(true, false, s.time, s.head_dim, s.time, p, s.time, dO, ldo,
              dv + at(dv_strides, b, h), dv_strides[2], false);
      // dP = dO V^T, then through the softmax and the scale.
      gemm<T>(false, true, s.time, s.time, s.head_dim, dO, ldo, v + at(v_strides, b, h),
              v_strides[2], dscores.data(), s.time, false);
      softmax_backward<T>(p, dscores.data(), dscores.data(), s.time, s.time);
      for (int64_t i = 0; i < tt; ++i)
        dscores[i] *= scale;
      // dQ = dS K, dK = dS^T Q
      gemm<T>(false, false, s.time, s.head_dim, s.time, dscores.data(), s.time,
              k + at(k_strides, b, h), k_strides[2], dq + at(dq_strides, b, h), dq_strides[2],
              false);
      gemm<T>(true, false, s.time, s.head_dim, s.time, dscores.data(), s.time,
              q + at(q_strides, b, h), q_strides[2], dk + at(dk_strides, b, h), dk_strides[2],
              false);
    }
  });
}

#define LOOM_INSTANTIATE(T)                                                                       \
  template void causal_attention_forward<T>(const AttentionShape&, const T*, const int64_t*,      \
                                            const T*, const int64_t*, const T*, const int64_t*,   \
                                            T*, const int64_t*, T*);                              \
  template void causal_attention_backward<T>(                                                     \
      const AttentionShape&, const T*, const int64_t*, const T*, const int64_t*, const T*,        \
      const int64_t*, const T*, const int64_t*, const T*, T*, const int64_t*, T*, const int64_t*, \
      T*, const int64_t*);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
#undef LOOM_INSTANTIATE

}  // namespace loom::kernels::cpu
