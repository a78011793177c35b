// The GPT model end to end: gradients against finite differences, activation checkpointing.

#include <gtest/gtest.h>

#include "gradcheck.h"
#include "nn/gpt.h"

namespace loom::nn {
namespace {

GPTConfig tiny_f64() {
  GPTConfig c;
  c.vocab_size = 11;
  c.context = 6;
  c.layers = 2;
  c.heads = 2;
  c.embd = 8;
  c.options.dtype = DType::F64;
  return c;
}

struct Batch {
  Tensor tokens, targets;
};

Batch tiny_batch() {
  return {Tensor::from_vector<int64_t>({1, 4, 7, 2, 9, 3, 5, 0, 10, 6}, {2, 5}),
          Tensor::from_vector<int64_t>({4, 7, 2, 9, 3, 8, 0, 10, 6, 1}, {2, 5})};
}

TEST(Gpt, GradientsMatchFiniteDifferences) {
  GPT model(tiny_f64(), 3);
  Batch batch = tiny_batch();
  model.loss(batch.tokens, batch.targets).backward();
  double eps = 1e-6;
  for (auto& [name, p] : model.named_parameters()) {
    std::vector<double> analytic = p.grad().to_vector<double>();
    double* data = p.data<double>();
    for (int64_t j = 0; j < p.numel(); ++j) {
      double saved = data[j];
      NoGradGuard no_grad;
      data[j] = saved + eps;
      double plus = model.loss(batch.tokens, batch.targets).item();
      data[j] = saved - eps;
      double minus = model.loss(batch.tokens, batch.targets).item();
      data[j] = saved;
      double numeric = (plus - minus) / (2 * eps);
      ASSERT_NEAR(analytic[j], numeric, 1e-7 * (1 + std::abs(numeric))) << name << "[" << j << "]";
    }
  }
}

TEST(Gpt, InitialLossIsNearLogVocab) {
  GPTConfig c = tiny_f64();
  c.vocab_size = 64;
  GPT model(c, 0);
  Batch batch = tiny_batch();
  EXPECT_NEAR(model.loss(batch.tokens, batch.targets).item(), std::log(64.0), 0.1);
}

TEST(Gpt, ActivationCheckpointingGivesBitwiseEqualGradients) {
  GPTConfig c = tiny_f64();
  c.options.dtype = DType::F32;
  GPT plain(c, 5);
  c.checkpoint_activations = true;
  GPT recomputed(c, 5);
  Batch batch = tiny_batch();
  Tensor l1 = plain.loss(batch.tokens, batch.targets);
  Tensor l2 = recomputed.loss(batch.tokens, batch.targets);
  EXPECT_EQ(l1.item(), l2.item());
  l1.backward();
  l2.backward();
  auto a = plain.named_parameters(), b = recomputed.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].second.grad().to_vector<float>(), b[i].second.grad().to_vector<float>())
        << a[i].first;
  }
}

TEST(Gpt, EveryParameterGetsExactlyOneGradReadyCall) {
  GPT model(tiny_f64(), 0);
  std::map<std::string, int> calls;
  for (auto& [name, p] : model.named_parameters()) {
    std::string key = name;
    p.register_grad_ready_hook([&calls, key](Tensor&) { calls[key]++; });
  }
  Batch batch = tiny_batch();
  model.loss(batch.tokens, batch.targets).backward();
  ASSERT_EQ(calls.size(), model.named_parameters().size());
  for (auto& [name, n] : calls)
    EXPECT_EQ(n, 1) << name;
}

}  // namespace
}  // namespace loom::nn
