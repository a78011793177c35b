#pragma once
// Row-major GEMM: C = op(A) op(B) (+ C when accumulate). f32 runs oneDNN's sgemm (the
// fastest of Eigen, oneDNN, OpenBLAS and BLIS on this project's shapes: docs/performance.md),
// f64 Eigen's. A large f32 product is computed in fixed blocks of C shared out among the
// intra-op threads (thread_pool.h, Note [GEMM blocks]): its bits do not depend on the thread
// count. An operand of such a product whose rows lie a multiple of 512 floats apart is first
// copied into longer rows (Note [Rows 512 floats apart]).
// op(A) is [M, K]: A itself (row-major, leading dimension lda) or, with trans_a, the
// transpose of a row-major [K, M] matrix. Likewise op(B) is [K, N].

#include <cstdint>

namespace loom::kernels::cpu {

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate);

// The same product of bf16 operands and result (their bits): products exact, sums in f32 (C's
// old values included when accumulating), each element of C rounded to bf16 once, to nearest
// even. Where the CPU has bf16 instructions (AVX512_BF16 or AMX: bf16_gemm_is_native()) it
// runs oneDNN's bf16 matmul on them; elsewhere the operands are widened to f32 and multiplied
// by gemm<float> (the same numbers up to the order of the sums). Blocked like gemm<float>:
// the bits do not depend on the thread count.
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* c, int64_t ldc,
               bool accumulate);
// The same product with C in f32: the f32 sums as they are, not rounded to bf16 (a bf16-mixed
// weight gradient: Note [Weight gradients in f32] in tensor/autocast.cpp).
void gemm_bf16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const uint16_t* a,
               int64_t lda, const uint16_t* b, int64_t ldb, float* c, int64_t ldc,
               bool accumulate);
// LOOM_BF16_GEMM=f32 in the environment takes the f32 fallback on any CPU (core/tunables.h).
bool bf16_gemm_is_native();
// "AMX", "AVX512_BF16" or "none: computed in f32", for a run's one-line note.
const char* bf16_gemm_instructions();

}  // namespace loom::kernels::cpu
