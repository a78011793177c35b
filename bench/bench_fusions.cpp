// The two fusions of a GPT-2 block, forward and backward, against the ops they replace:
// bias_gelu(matmul(x, w), b) against gelu(linear(x, w, b)) (Note [Bias and GELU in one pass];
// the product included, so the figure is the MLP's first layer), and add_layer_norm against
// add then layer_norm. Same values up to rounding (validated), one pass fewer each way.

#include "bench/validate.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::bench {
namespace {

Tensor random_leaf(const Shape& shape, Generator& gen, double std = 1) {
  Tensor t = Tensor::empty(shape);
  normal_(t, 0, std, gen);
  return t.set_requires_grad(true);
}

void clear_grads(std::initializer_list<Tensor> leaves) {
  for (Tensor t : leaves) t.set_grad(Tensor());
}

// Arguments: fused (0: linear then gelu, 1: bias_gelu after matmul), rows, in, out.
void BM_MlpFirstLayerForwardBackward(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  const int64_t rows = state.range(1), in = state.range(2), out = state.range(3);
  Generator gen(8);
  Tensor x = random_leaf({rows, in}, gen), w = random_leaf({in, out}, gen, 0.02),
         b = random_leaf({out}, gen, 0.1);
  auto run = [&](bool f) { return f ? bias_gelu(matmul(x, w), b) : gelu(linear(x, w, b)); };
  if (!validated(state, compare(run(true).to_vector<float>(), run(false).to_vector<float>()),
                 1e-5))
    return;
  Tensor dy = Tensor::empty({rows, out});  // a contiguous gradient, as a model's are
  normal_(dy, 0, 1, gen);
  for (auto _ : state) {
    clear_grads({x, w, b});
    run(fused).backward(dy);
  }
  state.counters["GFLOP/s"] = benchmark::Counter(6.0 * double(rows * in * out) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// Arguments: fused (0: add then layer_norm, 1: add_layer_norm), rows, width.
void BM_ResidualLayerNormForwardBackward(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  const int64_t rows = state.range(1), width = state.range(2);
  Generator gen(9);
  Tensor x = random_leaf({rows, width}, gen), r = random_leaf({rows, width}, gen),
         w = random_leaf({width}, gen), b = random_leaf({width}, gen);
  auto run = [&](bool f) {
    if (f) {
      AddNorm h = add_layer_norm(x, r, w, b);
      return add(h.sum, h.normed);
    }
    Tensor h = add(x, r);
    return add(h, layer_norm(h, w, b));
  };
  if (!validated(state, compare(run(true).to_vector<float>(), run(false).to_vector<float>()),
                 0))
    return;
  Tensor dy = Tensor::empty({rows, width});  // a contiguous gradient, as a model's are
  normal_(dy, 0, 1, gen);
  for (auto _ : state) {
    clear_grads({x, r, w, b});
    run(fused).backward(dy);
  }
  // Rows normalised a second, forward and backward.
  state.counters["rows/s"] = benchmark::Counter(double(rows),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// bench/cpu_step/size_sweep.sh's shapes: 10.7M (2048 rows, 384 wide) and GPT-2 small at
// ctx 512 batch 2 (1024 rows, 768 wide) and ctx 1024 batch 8 (8192 rows).
BENCHMARK(BM_MlpFirstLayerForwardBackward)
    ->ArgNames({"fused", "rows", "in", "out"})
    ->ArgsProduct({{0, 1}, {2048}, {384}, {1536}})
    ->ArgsProduct({{0, 1}, {1024}, {768}, {3072}})
    ->ArgsProduct({{0, 1}, {8192}, {768}, {3072}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ResidualLayerNormForwardBackward)
    ->ArgNames({"fused", "rows", "width"})
    ->ArgsProduct({{0, 1}, {2048}, {384}})
    ->ArgsProduct({{0, 1}, {1024}, {768}})
    ->ArgsProduct({{0, 1}, {8192}, {768}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace loom::bench
