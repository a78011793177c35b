// Layer norm forward and backward over rows of width C.

#include "bench/roofline.h"
#include "bench/validate.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::bench {
namespace {

void BM_LayerNormForward(benchmark::State& state) {
  int64_t rows = state.range(0), width = state.range(1);
  Generator gen(2);
  Tensor x = Tensor::empty({rows, width}), w = Tensor::empty({width}), b = Tensor::empty({width});
  normal_(x, 0, 1, gen);
  normal_(w, 1, 0.1, gen);
  normal_(b, 0, 0.1, gen);
  std::vector<float> xs = x.to_vector<float>(), ws = w.to_vector<float>(),
                     bs = b.to_vector<float>();
  std::vector<double> want(xs.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < width; ++i)
      mean += xs[r * width + i] / double(width);
    for (int64_t i = 0; i < width; ++i)
      var += std::pow(xs[r * width + i] - mean, 2) / double(width);
    for (int64_t i = 0; i < width; ++i)
      want[r * width + i] = (xs[r * width + i] - mean) / std::sqrt(var + 1e-5) * ws[i] + bs[i];
  }
  if (!validated(state, compare(layer_norm(x, w, b).to_vector<float>(), want), 1e-5)) return;
  for (auto _ : state)
    benchmark::DoNotOptimize(layer_norm(x, w, b));
  // Bytes: read x, write y.
  state.counters["GB/s"] = benchmark::Counter(2.0 * rows * width * 4 * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  set_working_set(state, 2.0 * rows * width * 4);
}

void BM_LayerNormBackward(benchmark::State& state) {
  int64_t rows = state.range(0), width = state.range(1);
  Generator gen(3);
  Tensor x = Tensor::empty({rows, width}), w = Tensor::ones({width}), b = Tensor::zeros({width});
  normal_(x, 0, 1, gen);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor dy = Tensor::empty({rows, width});
  normal_(dy, 0, 1, gen);
  // Reference property: with weight 1 the input gradient of each row sums to zero.
  layer_norm(x, w, b).backward(dy);
  std::vector<float> dx = x.grad().to_vector<float>();
  std::vector<double> row_sums(rows, 0.0), zeros(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width; ++i)
      row_sums[r] += dx[r * width + i];
  if (!validated(state, compare(row_sums, zeros), 1e-4)) return;
  for (auto _ : state) {
    Tensor y = layer_norm(x, w, b);
    y.backward(dy);
  }
  state.counters["GB/s"] = benchmark::Counter(5.0 * rows * width * 4 * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  set_working_set(state, 5.0 * rows * width * 4);
}

BENCHMARK(BM_LayerNormForward)
    ->ArgNames({"rows", "C"})
    ->Args({1024, 128})
    ->Args({4096, 768})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerNormBackward)
    ->ArgNames({"rows", "C"})
    ->Args({1024, 128})
    ->Args({4096, 768})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace loom::bench
