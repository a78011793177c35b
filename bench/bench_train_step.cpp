// One full training step of train_gpt's default config (forward, backward, gradient clipping,
// AdamW): the figure docs/performance.md compares with PyTorch.

#include "bench/validate.h"
#include "data/default_corpus.h"
#include "data/token_blocks.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"

namespace loom::bench {
namespace {

nn::GPTConfig config_from(benchmark::State& state, DType dtype) {
  nn::GPTConfig c;
  c.layers = state.range(0);
  c.heads = state.range(1);
  c.embd = state.range(2);
  c.context = state.range(3);
  c.vocab_size = 256;
  c.options.dtype = dtype;
  return c;
}

void BM_TrainStep(benchmark::State& state) {
  int64_t batch = state.range(4);
  nn::GPTConfig config = config_from(state, DType::F32);
  nn::GPT model(config, 0);
  data::TokenBlocks data(data::default_corpus(1 << 18), batch, config.context, 256);
  data::Batch first = data.for_step(0);
  {
    // Reference: the same model in f64 (same seed, so the same weights up to f32 rounding).
    nn::GPT reference(config_from(state, DType::F64), 0);
    double want = reference.loss(first.tokens, first.targets).item();
    double got = model.loss(first.tokens, first.targets).item();
    if (!validated(state, compare(std::vector<double>{got}, std::vector<double>{want}), 1e-4)) {
      return;
    }
  }
  std::vector<Tensor> params = model.parameters();
  optim::AdamW opt(params, {.lr = 1e-3, .weight_decay = 0.1});
  int64_t step = 0;
  for (auto _ : state) {
    data::Batch b = data.for_step(step++);
    Tensor loss = model.loss(b.tokens, b.targets);
    loss.backward();
    optim::clip_grad_norm(params, 1.0);
    opt.step();
    opt.zero_grad();
  }
  state.counters["tokens/s"] = benchmark::Counter(double(batch * config.context),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

// --layers 4 --heads 4 --embd 128 --ctx 128 --batch 8: the comparison config.
BENCHMARK(BM_TrainStep)
    ->ArgNames({"layers", "heads", "embd", "ctx", "batch"})
    ->Args({4, 4, 128, 128, 8})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(3.0);

}  // namespace
}  // namespace loom::bench
