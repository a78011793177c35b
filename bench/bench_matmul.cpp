// GEMM through the matmul op: the three layouts a training step uses (x W, dY W^T, X^T dY).

#include "bench/validate.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::bench {
namespace {

std::vector<double> reference_matmul(const std::vector<float>& a, const std::vector<float>& b,
                                     int64_t m, int64_t k, int64_t n) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] += double(a[i * k + p]) * b[p * n + j];
  return c;
}

// Args: M, K, N, layout (0: A B, 1: A B^T-view, 2: A^T-view B).
void BM_Matmul(benchmark::State& state) {
  int64_t m = state.range(0), k = state.range(1), n = state.range(2), layout = state.range(3);
  Generator gen(1);
  Tensor a = Tensor::empty({m, k}), b = Tensor::empty({k, n});
  normal_(a, 0, 1, gen);
  normal_(b, 0, 1, gen);
  // The same product through transposed views: B^T stored as [n, k], A^T stored as [k, m].
  Tensor lhs = layout == 2 ? a.transpose(0, 1).contiguous().transpose(0, 1) : a;
  Tensor rhs = layout == 1 ? b.transpose(0, 1).contiguous().transpose(0, 1) : b;
  auto want = reference_matmul(a.to_vector<float>(), b.to_vector<float>(), m, k, n);
  if (!validated(state, compare(matmul(lhs, rhs).to_vector<float>(), want), 1e-3 * k)) return;
  for (auto _ : state)
    benchmark::DoNotOptimize(matmul(lhs, rhs));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * n * k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Shapes of the default train_gpt config (B*T = 1024 rows, C = 128, vocab 256).
BENCHMARK(BM_Matmul)
    ->ArgNames({"M", "K", "N", "layout"})
    ->Args({1024, 128, 384, 0})
    ->Args({1024, 128, 512, 0})
    ->Args({1024, 512, 128, 0})
    ->Args({1024, 128, 256, 1})
    ->Args({1024, 384, 128, 1})
    ->Args({128, 1024, 512, 2})
    ->Args({512, 512, 512, 0})
    // Larger models' MLP products: a 1024-wide pipeline stage's micro-batch of 256 rows
    // (bench/parallelism/vs_peers.sh at 25M) and GPT-2 small at ctx 512, batch 2.
    ->Args({256, 1024, 4096, 0})
    ->Args({1024, 768, 3072, 0})
    // The 25M sweep shape's (8 x 512 wide, ctx 256, batch 8: 2048 rows): c_attn, c_fc and
    // the MLP's c_proj forward, c_fc's input gradient (dY W^T) and weight gradient (X^T dY).
    ->Args({2048, 512, 1536, 0})
    ->Args({2048, 512, 2048, 0})
    ->Args({2048, 2048, 512, 0})
    ->Args({2048, 2048, 512, 1})
    ->Args({512, 2048, 2048, 2})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace loom::bench
