#include "kernels/cpu/gemm.h"

#include <dnnl.h>

#include <Eigen/Core>
#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cpu/thread_pool.h"

// The OpenMP runtime libdnnl runs on, GNU's libgomp (linked by name: CMakeLists.txt), whose
// function is declared here rather than through <omp.h>, which a clang build would take from
// LLVM's OpenMP.
extern "C" void omp_set_num_threads(int threads);

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

// oneDNN runs its GEMM on OpenMP threads, as many as the calling thread's OpenMP setting
// says (by default every core). Loom keeps each call on one thread: the first call on a
// thread sets that thread's OpenMP team to one (omp_set_num_threads, above).
void sgemm_on_this_thread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                          int64_t ldc, bool accumulate) {
  static thread_local const bool one_thread = (omp_set_num_threads(1), true);
  (void)one_thread;
  const dnnl_status_t status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, 1.0f,
                                          a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
  if (status != dnnl_success) {
    tag::kKernelsCpu.fail("oneDNN sgemm failed (status ", static_cast<int>(status), ") for ", m,
                          " x ", n, " x ", k, ", lda ", lda, ", ldb ", ldb, ", ldc ", ldc);
  }
}

}  // namespace

// Note [GEMM blocks]
// A product of at least kBlockedWork multiply-adds is computed as blocks of kBlock rows of C
// (or columns, when C is wider than tall), one sgemm call each, whatever the thread count;
// the threads share out the blocks. Each element of C is then always computed by the same
// call on the same operands, so the bits do not depend on the number of threads. On this
// project's shapes the blocks cost about 2% of one thread's time and give bitwise the
// unblocked product (bench/gemm_backends).
template <>
void gemm<float>(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t kBlock = 128;
  constexpr int64_t kBlockedWork = int64_t{1} << 21;
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum: zeros (oneDNN refuses k = 0)
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i)
        std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  const int64_t blocks = m * n * k >= kBlockedWork ? (extent + kBlock - 1) / kBlock : 1;
  if (blocks == 1) {
    sgemm_on_this_thread(trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, accumulate);
    return;
  }
  parallel_for(blocks, 1, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      const int64_t begin = block * kBlock, size = std::min(kBlock, extent - begin);
      if (by_rows) {  // rows begin.. of op(A) and of C
        sgemm_on_this_thread(trans_a, trans_b, size, n, k, trans_a ? a + begin : a + begin * lda,
                             lda, b, ldb, c + begin * ldc, ldc, accumulate);
      } else {  // columns begin.. of op(B) and of C
        sgemm_on_this_thread(trans_a, trans_b, m, size, k, a, lda,
                             trans_b ? b + begin * ldb : b + begin, ldb, c + begin, ldc,
                             accumulate);
      }
    }
  });
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
