#include "kernels/cpu/gemm.h"

#include <dnnl.h>
#include <omp.h>

#include <Eigen/Core>
#include <string>

#include "tensor/error.h"

namespace loom::kernels::cpu {

namespace {

template <typename T>
using RowMajorMap =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>,
               Eigen::Unaligned, Eigen::OuterStride<>>;
template <typename T>
using MutableRowMajorMap =
    Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
               Eigen::OuterStride<>>;

template <typename T, typename A, typename B>
void multiply(const A& a, const B& b, MutableRowMajorMap<T>& c, bool accumulate) {
  if (accumulate) {
    c.noalias() += a * b;
  } else {
    c.noalias() = a * b;
  }
}

}  // namespace

// oneDNN runs its GEMM on OpenMP threads, as many as the calling thread's OpenMP setting
// says (by default every core). Loom keeps each call on its caller (see gemm.h): the first
// call on a thread sets that thread's OpenMP team to one.
template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                 bool accumulate) {
  if (m == 0 || n == 0) return;
  static thread_local const bool one_thread = (omp_set_num_threads(1), true);
  (void)one_thread;
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb,
                 accumulate ? 1.0f : 0.0f, c, ldc);
  if (status != dnnl_success) {
    fail("[kernels/cpu] oneDNN sgemm failed (status ", static_cast<int>(status), ") for ", m,
         " x ", n, " x ", k, ", lda ", lda, ", ldb ", ldb, ", ldc ", ldc);
  }
}

template <>
void gemm<double>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const double* a,
                  int64_t lda, const double* b, int64_t ldb, double* c, int64_t ldc,
                  bool accumulate) {
  using T = double;
  MutableRowMajorMap<T> cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (!accumulate) cm.setZero();
    return;
  }
  // A transposed operand is the row-major map of the stored matrix, transposed for free.
  RowMajorMap<T> am(a, trans_a ? k : m, trans_a ? m : k, Eigen::OuterStride<>(lda));
  RowMajorMap<T> bm(b, trans_b ? n : k, trans_b ? k : n, Eigen::OuterStride<>(ldb));
  if (!trans_a && !trans_b) multiply<T>(am, bm, cm, accumulate);
  if (!trans_a && trans_b) multiply<T>(am, bm.transpose(), cm, accumulate);
  if (trans_a && !trans_b) multiply<T>(am.transpose(), bm, cm, accumulate);
  if (trans_a && trans_b) multiply<T>(am.transpose(), bm.transpose(), cm, accumulate);
}

}  // namespace loom::kernels::cpu
