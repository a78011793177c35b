#include "kernels/cpu/attention.h"

#include <algorithm>
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

// Note [Causal blocks]
// Row i attends to keys 0..i only, so the products run on blocks of kRows query rows: rows
// [r0, r1) need keys [0, r1) (and, transposed, key rows [c0, c1) receive from query rows
// [c0, T)). Of a T x T product at T = 128 that is 10 blocks of 16, 5/8 of the work; the
// probabilities beyond the diagonal are exact zeros, so nothing of the result is lost.
constexpr int64_t kRows = 32;

template <typename T>
void causal_attention_forward(const AttentionShape& s, const T* q, const int64_t* q_strides,
                              const T* k, const int64_t* k_strides, const T* v,
                              const int64_t* v_strides, T* out, const int64_t* out_strides,
                              T* probs) {
  const int64_t t = s.time, tt = t * t;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  parallel_rows(s.batch * s.heads, tt, [&](int64_t first, int64_t last) {
    for (int64_t bh = first; bh < last; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      const T* qh = q + at(q_strides, b, h);
      T* p = probs + bh * tt;
      for (int64_t r0 = 0; r0 < t; r0 += kRows) {  // scores of rows r0.. against keys 0..r1
        const int64_t r1 = std::min(t, r0 + kRows);
        gemm<T>(false, true, r1 - r0, r1, s.head_dim, qh + r0 * q_strides[2], q_strides[2],
                k + at(k_strides, b, h), k_strides[2], p + r0 * t, t, false);
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t j = 0; j < r1; ++j)
            p[r * t + j] *= scale;
      }
      softmax_forward<T>(p, p, t, t, t);  // reads keys 0..r of row r, zeroes the rest
      T* oh = out + at(out_strides, b, h);
      for (int64_t r0 = 0; r0 < t; r0 += kRows) {
        const int64_t r1 = std::min(t, r0 + kRows);
        gemm<T>(false, false, r1 - r0, s.head_dim, r1, p + r0 * t, t, v + at(v_strides, b, h),
                v_strides[2], oh + r0 * out_strides[2], out_strides[2], false);
      }
    }
  });
}

template <typename T>
void causal_attention_backward(const AttentionShape& s, const T* dout, const int64_t* dout_strides,
                               const T* q, const int64_t* q_strides, const T* k,
                               const int64_t* k_strides, const T* v, const int64_t* v_strides,
                               const T* probs, T* dq, const int64_t* dq_strides, T* dk,
                               const int64_t* dk_strides, T* dv, const int64_t* dv_strides) {
  const int64_t t = s.time, tt = t * t;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  parallel_rows(s.batch * s.heads, tt, [&](int64_t first, int64_t last) {
    // Zeros beyond the diagonal stay zeros: only the blocks below it are written.
    std::vector<T> dscores(static_cast<size_t>(tt), T(0));
    T* ds = dscores.data();
    for (int64_t bh = first; bh < last; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads;
      const T* p = probs + bh * tt;
      const T* dO = dout + at(dout_strides, b, h);
      const int64_t ldo = dout_strides[2];
      const T* qh = q + at(q_strides, b, h);
      const T* kh = k + at(k_strides, b, h);
      for (int64_t c0 = 0; c0 < t; c0 += kRows) {
        const int64_t c1 = std::min(t, c0 + kRows);
        // dV = P^T dO: key rows c0.. from query rows c0..T.
        gemm<T>(true, false, c1 - c0, s.head_dim, t - c0, p + c0 * t + c0, t, dO + c0 * ldo, ldo,
                dv + at(dv_strides, b, h) + c0 * dv_strides[2], dv_strides[2], false);
        // dP = dO V^T: query rows c0.. against keys 0..c1.
        gemm<T>(false, true, c1 - c0, c1, s.head_dim, dO + c0 * ldo, ldo, v + at(v_strides, b, h),
                v_strides[2], ds + c0 * t, t, false);
      }
      softmax_backward<T>(p, ds, ds, t, t);
      for (int64_t i = 0; i < tt; ++i)
        ds[i] *= scale;
      for (int64_t r0 = 0; r0 < t; r0 += kRows) {
        const int64_t r1 = std::min(t, r0 + kRows);
        // dQ = dS K: query rows r0.. from keys 0..r1; dK = dS^T Q: key rows r0.. from query
        // rows r0..T.
        gemm<T>(false, false, r1 - r0, s.head_dim, r1, ds + r0 * t, t, kh, k_strides[2],
                dq + at(dq_strides, b, h) + r0 * dq_strides[2], dq_strides[2], false);
        gemm<T>(true, false, r1 - r0, s.head_dim, t - r0, ds + r0 * t + r0, t,
                qh + r0 * q_strides[2], q_strides[2],
                dk + at(dk_strides, b, h) + r0 * dk_strides[2], dk_strides[2], false);
      }
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
