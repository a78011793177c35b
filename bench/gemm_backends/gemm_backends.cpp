// The candidates for Loom's CPU f32 GEMM on the shapes of train_gpt's default model (4
// blocks, embd 128, ctx 128, batch 8: 1024 rows), one thread: Eigen 3.4 (Loom's before),
// oneDNN's dnnl_sgemm, and the Fortran sgemm_ of OpenBLAS or BLIS (whichever this is
// linked with). run.sh builds one program per candidate and runs them interleaved.
// Every product is checked against a double-precision reference before it is timed.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#if defined(USE_DNNL)
#include <dnnl.h>
#elif defined(USE_EIGEN)
#include <Eigen/Core>
#else
extern "C" void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*,
                       const float*, const int*, const float*, const int*, const float*, float*,
                       const int*);
#endif

namespace {

// Row-major C[m, n] = op(A) op(B).
void gemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          float* c, int ldc) {
#if defined(USE_DNNL)
  dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
#elif defined(USE_EIGEN)
  using Map = Eigen::Map<const Eigen::Matrix<float, -1, -1, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
  Eigen::Map<Eigen::Matrix<float, -1, -1, Eigen::RowMajor>, 0, Eigen::OuterStride<>> cm(
      c, m, n, Eigen::OuterStride<>(ldc));
  Map am(a, ta ? k : m, ta ? m : k, Eigen::OuterStride<>(lda));
  Map bm(b, tb ? n : k, tb ? k : n, Eigen::OuterStride<>(ldb));
  if (!ta && !tb) cm.noalias() = am * bm;
  if (!ta && tb) cm.noalias() = am * bm.transpose();
  if (ta && !tb) cm.noalias() = am.transpose() * bm;
  if (ta && tb) cm.noalias() = am.transpose() * bm.transpose();
#else
  // Column-major BLAS: C^T[n, m] = op(B)^T op(A)^T.
  const float one = 1, zero = 0;
  sgemm_(tb ? "T" : "N", ta ? "T" : "N", &n, &m, &k, &one, b, &ldb, a, &lda, &zero, c, &ldc);
#endif
}

struct Shape {
  const char* name;
  bool ta, tb;
  int m, n, k, batch;
};

}  // namespace

int main() {
  const Shape shapes[] = {
      {"c_attn forward 1024x128 @ 128x384", false, false, 1024, 384, 128, 1},
      {"c_fc forward 1024x128 @ 128x512", false, false, 1024, 512, 128, 1},
      {"mlp c_proj forward 1024x512 @ 512x128", false, false, 1024, 128, 512, 1},
      {"attn c_proj forward 1024x128 @ 128x128", false, false, 1024, 128, 128, 1},
      {"head forward 1024x128 @ (256x128)^T", false, true, 1024, 256, 128, 1},
      {"c_fc dX 1024x512 @ (128x512)^T", false, true, 1024, 128, 512, 1},
      {"c_fc dW (1024x128)^T @ 1024x512", true, false, 128, 512, 1024, 1},
      {"mlp c_proj dW (1024x512)^T @ 1024x128", true, false, 512, 128, 1024, 1},
      {"attention scores 32 x 128x32 @ (128x32)^T", false, true, 128, 128, 32, 32},
      {"attention values 32 x 128x128 @ 128x32", false, false, 128, 32, 128, 32},
  };
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  double total_ms = 0;
  for (const Shape& s : shapes) {
    const int ar = s.ta ? s.k : s.m, ac = s.ta ? s.m : s.k;
    const int br = s.tb ? s.n : s.k, bc = s.tb ? s.k : s.n;
    std::vector<float> a(size_t(ar) * ac * s.batch), b(size_t(br) * bc * s.batch),
        c(size_t(s.m) * s.n * s.batch);
    for (float& x : a) x = uniform(rng);
    for (float& x : b) x = uniform(rng);
    auto run = [&] {
      for (int i = 0; i < s.batch; ++i)
        gemm(s.ta, s.tb, s.m, s.n, s.k, a.data() + size_t(i) * ar * ac, ac,
             b.data() + size_t(i) * br * bc, bc, c.data() + size_t(i) * s.m * s.n, s.n);
    };
    run();
    double worst = 0;  // against a double-precision product, first matrix of the batch
    for (int i = 0; i < s.m; ++i) {
      for (int j = 0; j < s.n; ++j) {
        double sum = 0;
        for (int p = 0; p < s.k; ++p) {
          const double x = s.ta ? a[size_t(p) * ac + i] : a[size_t(i) * ac + p];
          const double y = s.tb ? b[size_t(j) * bc + p] : b[size_t(p) * bc + j];
          sum += x * y;
        }
        worst = std::max(worst, std::abs(sum - c[size_t(i) * s.n + j]));
      }
    }
    if (worst > 1e-3) {
      std::printf("%s: wrong result (max error %g)\n", s.name, worst);
      return 1;
    }
    for (int i = 0; i < 5; ++i) run();
    std::vector<double> ms;
    for (int r = 0; r < 30; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double median = ms[ms.size() / 2];
    total_ms += median;
    std::printf("%-44s %8.3f ms %7.1f GFLOP/s\n", s.name, median,
                2.0 * s.m * s.n * s.k * s.batch / (median * 1e6));
  }
  std::printf("total %.2f ms\n", total_ms);
}
