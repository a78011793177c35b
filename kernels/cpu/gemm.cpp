#include "kernels/cpu/gemm.h"

#include <Eigen/Core>

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

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
          const T* b, int64_t ldb, T* c, int64_t ldc, bool accumulate) {
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

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, const float*, int64_t,
                          const float*, int64_t, float*, int64_t, bool);
template void gemm<double>(bool, bool, int64_t, int64_t, int64_t, const double*, int64_t,
                           const double*, int64_t, double*, int64_t, bool);

}  // namespace loom::kernels::cpu
