// The GPT model end to end: gradients against finite differences, activation checkpointing.

#include <gtest/gtest.h>

#include "causal_lm_checks.h"
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

using testing::Batch;
using testing::tiny_batch;

TEST(Gpt, GradientsMatchFiniteDifferences) {
  GPT model(tiny_f64(), 3);
  testing::expect_gradients_match_finite_differences(model);
}

TEST(Gpt, InitialLossIsNearLogVocab) {
  GPTConfig c = tiny_f64();
  c.vocab_size = 64;
  GPT model(c, 0);
  Batch batch = tiny_batch();
  EXPECT_NEAR(model.loss(batch.tokens, batch.targets).item(), std::log(64.0), 0.1);
}

// In f32 and under bf16 and f16 autocast: PyTorch's checkpoint replays the forward under the
// autocast state it ran in, and so does Loom's (the backward that recomputes runs outside it).
TEST(Gpt, ActivationCheckpointingGivesBitwiseEqualGradients) {
  for (DType autocast : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(autocast));
    GPTConfig c = tiny_f64();
    c.options.dtype = DType::F32;
    GPT plain(c, 5);
    c.checkpoint_activations = true;
    GPT recomputed(c, 5);
    testing::expect_checkpointing_bitwise(plain, recomputed, autocast);
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
