// oneDNN's sgemm with operands whose rows lie a multiple of 512 floats apart, as stored and
// with those rows 16 floats further apart (Note [Rows 512 floats apart] in
// kernels/cpu/gemm.cpp): the products of a GPT training step at the size sweep's widths
// (bench/cpu_step/size_sweep.sh), forward (x W), input gradient (dY W^T) and weight
// gradient (X^T dY), each through Loom's blocks (Note [GEMM blocks]), page-aligned as Loom's
// allocator gives them. Prints GFLOP/s as stored -> padded. Not part of the build:
//
//   g++ -O2 -std=c++17 bench/gemm_backends/padded_rows.cpp -ldnnl -o /tmp/padded_rows
//   OMP_NUM_THREADS=1 /tmp/padded_rows
#include <dnnl.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
double run(char ta, char tb, long m, long k, long n, bool pad) {
  long lda0 = ta == 'N' ? k : m, ldb0 = tb == 'N' ? n : k;
  long lda = lda0 + (pad && lda0 % 512 == 0 ? 16 : 0), ldb = ldb0 + (pad && ldb0 % 512 == 0 ? 16 : 0);
  long arows = ta == 'N' ? m : k, brows = tb == 'N' ? k : n;
  float* a = (float*)aligned_alloc(4096, (arows * lda * 4 + 4095) / 4096 * 4096);
  float* b = (float*)aligned_alloc(4096, (brows * ldb * 4 + 4095) / 4096 * 4096);
  float* c = (float*)aligned_alloc(4096, (m * n * 4 + 4095) / 4096 * 4096);
  for (long i = 0; i < arows * lda; ++i) a[i] = rand() / float(RAND_MAX);
  for (long i = 0; i < brows * ldb; ++i) b[i] = rand() / float(RAND_MAX);
  bool by_rows = m >= n;
  long extent = by_rows ? m : n, block = 128;
  while (block < 512 && extent >= 8 * block) block *= 2;
  if (m * n * k < (1L << 21)) block = extent;
  auto once = [&] {
    for (long s = 0; s < extent; s += block) {
      long size = std::min(block, extent - s);
      if (by_rows) dnnl_sgemm(ta, tb, size, n, k, 1.f, ta == 'T' ? a + s : a + s * lda, lda, b, ldb, 0.f, c + s * n, n);
      else dnnl_sgemm(ta, tb, m, size, k, 1.f, a, lda, tb == 'T' ? b + s * ldb : b + s, ldb, 0.f, c + s, n);
    }
  };
  once(); once();
  int count = 0; auto t0 = std::chrono::steady_clock::now(); double dt;
  do { once(); ++count; dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); } while (dt < 0.4);
  free(a); free(b); free(c);
  return 2.0 * m * n * k * count / dt / 1e9;
}
int main() {
  struct S { const char* model; long M, C, V; } models[] = {{"0.8M", 1024, 128, 256}, {"10M", 2048, 384, 256}, {"25M", 2048, 512, 256}, {"124M", 1024, 768, 50304}};
  for (auto& s : models) {
    long M = s.M, C = s.C;
    long shapes[][2] = {{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}};
    for (auto& w : shapes) {
      long in = w[0], out = w[1];
      double f0 = run('N', 'N', M, in, out, false), f1 = run('N', 'N', M, in, out, true);
      double x0 = run('N', 'T', M, out, in, false), x1 = run('N', 'T', M, out, in, true);
      double g0 = run('T', 'N', in, M, out, false), g1 = run('T', 'N', in, M, out, true);
      printf("%s W %ldx%ld: fwd %.0f->%.0f  dX %.0f->%.0f  dW %.0f->%.0f\n", s.model, in, out, f0, f1, x0, x1, g0, g1);
    }
  }
}
