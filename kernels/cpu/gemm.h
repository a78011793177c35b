#pragma once
// Row-major GEMM: C = op(A) op(B) (+ C when accumulate). f32 runs oneDNN's sgemm (the
// fastest of Eigen, oneDNN, OpenBLAS and BLIS on this project's shapes: docs/performance.md),
// f64 Eigen's. A large f32 product is computed in fixed blocks of C shared out among the
// intra-op threads (thread_pool.h, Note [GEMM blocks]): its bits do not depend on the thread
// count.
// op(A) is [M, K]: A itself (row-major, leading dimension lda) or, with trans_a, the
// transpose of a row-major [K, M] matrix. Likewise op(B) is [K, N].

#include <cstdint>

namespace loom::kernels::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate);

}  // namespace loom::kernels::cpu
