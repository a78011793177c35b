#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/lane_reduce.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_math.h"

namespace loom::kernels::cpu {

// Note [Flash attention on the CPU]
// The [T, T] score matrix of a head is never held: query rows go in tiles of kQueryRows, and
// each tile meets the keys it may see (0 .. its last row) in tiles of kKeyCols, one
// [kQueryRows, kKeyCols] block of scores at a time (128 KiB in f32: it stays in L2). The
// forward keeps each row's running maximum m and sum l of exp((s - m) * scale) and rescales
// the output rows when m grows (the online softmax of FlashAttention); at the end it divides
// by l and stores lse = m * scale + log(l). Backward (FlashAttention-2's) recomputes
// P = exp(s * scale - lse) tile by tile, with D = rowsum(dO * O):
//   dV += P^T dO,   dP = dO V^T,   dS = P (dP - D) scale,   dQ += dS K,   dK += dS^T Q.
// Blocks above the diagonal are skipped and entries above it are exact zeros. A thread owns
// whole (batch, head) pairs in the forward and whole (batch, key/value head) pairs in the
// backward, whose query heads it visits in order, so every sum runs in one order whatever
// the thread count. kKeyCols is a multiple of kQueryRows, so a key tile never starts past a
// row of the query tile it meets: every row sees at least one key in every tile.
constexpr int64_t kQueryRows = 64;
constexpr int64_t kKeyCols = 256;
static_assert(kKeyCols % kQueryRows == 0);

namespace {

inline int64_t at(const int64_t* strides, int64_t b, int64_t h) {
  return b * strides[0] + h * strides[1];
}

// Keys row `row` of a tile starting at key c0 may see: c0 .. row (at least one, see the Note).
inline int64_t visible_keys(int64_t row, int64_t c0, int64_t cols) {
  return std::min(cols, row + 1 - c0);
}

}  // namespace

template <typename T>
void causal_attention_forward(const AttentionShape& s, const T* q, const int64_t* q_strides,
                              const T* k, const int64_t* k_strides, const T* v,
                              const int64_t* v_strides, T* out, const int64_t* out_strides,
                              T* lse) {
  const int64_t t = s.time, d = s.head_dim, group = s.heads / s.kv_heads;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t ldq = q_strides[2], ldk = k_strides[2], ldv = v_strides[2],
                ldo = out_strides[2];
  parallel_rows(s.batch * s.heads, t * t, [&](int64_t first, int64_t last) {
    std::vector<T> scores(static_cast<size_t>(kQueryRows * kKeyCols));
    T row_max[kQueryRows], row_sum[kQueryRows];
    for (int64_t bh = first; bh < last; ++bh) {
      const int64_t b = bh / s.heads, h = bh % s.heads, kvh = h / group;
      const T* qh = q + at(q_strides, b, h);
      const T* kh = k + at(k_strides, b, kvh);
      const T* vh = v + at(v_strides, b, kvh);
      T* oh = out + at(out_strides, b, h);
      T* lse_h = lse + bh * t;
      for (int64_t r0 = 0; r0 < t; r0 += kQueryRows) {
        const int64_t r1 = std::min(t, r0 + kQueryRows), rows = r1 - r0;
        for (int64_t c0 = 0; c0 < r1; c0 += kKeyCols) {
          const int64_t cols = std::min(r1, c0 + kKeyCols) - c0;
          gemm<T>(false, true, rows, cols, d, qh + r0 * ldq, ldq, kh + c0 * ldk, ldk,
                  scores.data(), cols, false);
          for (int64_t i = 0; i < rows; ++i) {
            T* si = scores.data() + i * cols;
            const int64_t valid = visible_keys(r0 + i, c0, cols);
            const T before = c0 == 0 ? -std::numeric_limits<T>::infinity() : row_max[i];
            const T m = lane_max(si, valid, before);
            for (int64_t j = 0; j < valid; ++j)
              si[j] = exp_approx((si[j] - m) * scale);
            std::fill(si + valid, si + cols, T(0));
            const T fresh = lane_sum(si, valid);
            if (c0 == 0) {
              row_sum[i] = fresh;
            } else {  // the running sum and the output so far were relative to `before`
              const T rescale = exp_approx((before - m) * scale);
              row_sum[i] = row_sum[i] * rescale + fresh;
              T* o = oh + (r0 + i) * ldo;
              for (int64_t x = 0; x < d; ++x)
                o[x] *= rescale;
            }
            row_max[i] = m;
          }
          gemm<T>(false, false, rows, d, cols, scores.data(), cols, vh + c0 * ldv, ldv,
                  oh + r0 * ldo, ldo, c0 > 0);
        }
        for (int64_t i = 0; i < rows; ++i) {
          const T inv = T(1) / row_sum[i];
          T* o = oh + (r0 + i) * ldo;
          for (int64_t x = 0; x < d; ++x)
            o[x] *= inv;
          lse_h[r0 + i] = row_max[i] * scale + std::log(row_sum[i]);
        }
      }
    }
  });
}

template <typename T>
void causal_attention_backward(const AttentionShape& s, const T* dout, const int64_t* dout_strides,
                               const T* q, const int64_t* q_strides, const T* k,
                               const int64_t* k_strides, const T* v, const int64_t* v_strides,
                               const T* out, const int64_t* out_strides, const T* lse, T* dq,
                               const int64_t* dq_strides, T* dk, const int64_t* dk_strides, T* dv,
                               const int64_t* dv_strides) {
  const int64_t t = s.time, d = s.head_dim, group = s.heads / s.kv_heads;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
  const int64_t ldq = q_strides[2], ldk = k_strides[2], ldv = v_strides[2],
                ldo = out_strides[2], lddo = dout_strides[2], lddq = dq_strides[2],
                lddk = dk_strides[2], lddv = dv_strides[2];
  parallel_rows(s.batch * s.kv_heads, group * t * t, [&](int64_t first, int64_t last) {
    std::vector<T> probs(static_cast<size_t>(kQueryRows * kKeyCols));
    std::vector<T> dscores(probs.size());
    T delta[kQueryRows];
    for (int64_t bg = first; bg < last; ++bg) {
      const int64_t b = bg / s.kv_heads, kvh = bg % s.kv_heads;
      const T* kh = k + at(k_strides, b, kvh);
      const T* vh = v + at(v_strides, b, kvh);
      T* dkh = dk + at(dk_strides, b, kvh);
      T* dvh = dv + at(dv_strides, b, kvh);
      for (int64_t r = 0; r < t; ++r) {
        std::fill(dkh + r * lddk, dkh + r * lddk + d, T(0));
        std::fill(dvh + r * lddv, dvh + r * lddv + d, T(0));
      }
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const T* qh = q + at(q_strides, b, h);
        const T* oh = out + at(out_strides, b, h);
        const T* dOh = dout + at(dout_strides, b, h);
        const T* lse_h = lse + (b * s.heads + h) * t;
        T* dqh = dq + at(dq_strides, b, h);
        for (int64_t r0 = 0; r0 < t; r0 += kQueryRows) {
          const int64_t r1 = std::min(t, r0 + kQueryRows), rows = r1 - r0;
          for (int64_t i = 0; i < rows; ++i)
            delta[i] = lane_dot(dOh + (r0 + i) * lddo, oh + (r0 + i) * ldo, d);
          for (int64_t c0 = 0; c0 < r1; c0 += kKeyCols) {
            const int64_t cols = std::min(r1, c0 + kKeyCols) - c0;
            T* p = probs.data();
            T* ds = dscores.data();
            gemm<T>(false, true, rows, cols, d, qh + r0 * ldq, ldq, kh + c0 * ldk, ldk, p, cols,
                    false);
            gemm<T>(false, true, rows, cols, d, dOh + r0 * lddo, lddo, vh + c0 * ldv, ldv, ds,
                    cols, false);
            for (int64_t i = 0; i < rows; ++i) {
              T* pi = p + i * cols;
              T* dsi = ds + i * cols;
              const int64_t valid = visible_keys(r0 + i, c0, cols);
              const T l = lse_h[r0 + i], di = delta[i];
              for (int64_t j = 0; j < valid; ++j) {
                pi[j] = exp_approx(pi[j] * scale - l);
                dsi[j] = pi[j] * (dsi[j] - di) * scale;
              }
              std::fill(pi + valid, pi + cols, T(0));
              std::fill(dsi + valid, dsi + cols, T(0));
            }
            gemm<T>(true, false, cols, d, rows, p, cols, dOh + r0 * lddo, lddo, dvh + c0 * lddv,
                    lddv, true);
            gemm<T>(false, false, rows, d, cols, ds, cols, kh + c0 * ldk, ldk, dqh + r0 * lddq,
                    lddq, c0 > 0);
            gemm<T>(true, false, cols, d, rows, ds, cols, qh + r0 * ldq, ldq, dkh + c0 * lddk,
                    lddk, true);
          }
        }
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
      const int64_t*, const T*, const int64_t*, const T*, const int64_t*, const T*, T*,           \
      const int64_t*, T*, const int64_t*, T*, const int64_t*);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
#undef LOOM_INSTANTIATE

}  // namespace loom::kernels::cpu
