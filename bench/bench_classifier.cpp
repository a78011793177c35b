// The classifier and its loss, forward and backward: linear_cross_entropy's chunks (Note [The
// classifier without its logits]) against the two ops it replaces, cross_entropy(matmul(x,
// weight^T)), which hold the [rows, vocab] logits. Reports the step's rate and the bytes it
// allocated at its peak beyond its inputs.

#include "bench/validate.h"
#include "tensor/allocator.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::bench {
namespace {

struct Classifier {
  Tensor x, weight, targets;
};

Classifier random_classifier(int64_t rows, int64_t width, int64_t vocab) {
  Generator gen(6);
  Classifier c{Tensor::empty({rows, width}), Tensor::empty({vocab, width}), Tensor()};
  normal_(c.x, 0, 1, gen);
  normal_(c.weight, 0, 0.02, gen);
  c.x.set_requires_grad(true);
  c.weight.set_requires_grad(true);
  std::vector<int64_t> picks;
  for (int64_t r = 0; r < rows; ++r)
    picks.push_back((r * 2654435761) % vocab);
  c.targets = Tensor::from_vector(picks, {rows});
  return c;
}

Tensor loss_of(const Classifier& c, bool fused) {
  return fused ? linear_cross_entropy(c.x, c.weight, c.targets)
               : cross_entropy(matmul(c.x, transpose(c.weight, 0, 1)), c.targets);
}

// Arguments: fused (0: the composed ops, 1: linear_cross_entropy), rows, width, vocab.
void BM_ClassifierForwardBackward(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  const int64_t rows = state.range(1), width = state.range(2), vocab = state.range(3);
  Classifier c = random_classifier(rows, width, vocab);
  const double want = loss_of(c, false).item();
  const double got = loss_of(c, true).item();
  if (!validated(state, compare(std::vector<double>{got}, std::vector<double>{want}), 1e-5))
    return;
  Allocator& allocator = allocator_for(Device::cpu());
  const size_t before = allocator.stats().current_bytes;
  allocator.reset_peak();
  for (auto _ : state) {
    c.x.set_grad(Tensor());  // a new gradient each step, as after the optimizer's zero_grad
    c.weight.set_grad(Tensor());
    loss_of(c, fused).backward();
  }
  state.counters["peak_MB"] = double(allocator.stats().peak_bytes - before) / 1e6;
  state.counters["GFLOP/s"] = benchmark::Counter(6.0 * double(rows * width * vocab) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// The classifiers of bench/cpu_step/size_sweep.sh's shapes (rows = batch x ctx): 0.8M (1024 x
// 128, vocab 256), 10.7M (2048 x 384), GPT-2 small at ctx 512 batch 2 and ctx 1024 batch 8.
BENCHMARK(BM_ClassifierForwardBackward)
    ->ArgNames({"fused", "rows", "width", "vocab"})
    ->ArgsProduct({{0, 1}, {1024}, {128}, {256}})
    ->ArgsProduct({{0, 1}, {2048}, {384}, {256}})
    ->ArgsProduct({{0, 1}, {1024}, {768}, {50304}})
    ->ArgsProduct({{0, 1}, {8192}, {768}, {50304}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace loom::bench
