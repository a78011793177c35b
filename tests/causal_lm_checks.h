#pragma once
// Checks every causal language model's tests make (test_gpt.cpp, test_llama.cpp), over the
// same tiny batch: the loss's gradients against central finite differences (f64 models), and
// activation checkpointing giving bitwise the plain model's loss and gradients (f32, also
// under autocast).

#include <gtest/gtest.h>

#include <cmath>

#include "nn/causal_lm.h"
#include "tensor/autocast.h"

namespace loom::nn::testing {

struct Batch {
  Tensor tokens, targets;
};

// Two rows of five tokens below 11.
inline Batch tiny_batch() {
  return {Tensor::from_vector<int64_t>({1, 4, 7, 2, 9, 3, 5, 0, 10, 6}, {2, 5}),
          Tensor::from_vector<int64_t>({4, 7, 2, 9, 3, 8, 0, 10, 6, 1}, {2, 5})};
}

// Every `stride`-th element of every parameter of an f64 model.
inline void expect_gradients_match_finite_differences(CausalLM& model, int64_t stride = 1) {
  const Batch batch = tiny_batch();
  model.loss(batch.tokens, batch.targets).backward();
  const double eps = 1e-6;
  for (auto& [name, p] : model.named_parameters()) {
    std::vector<double> analytic = p.grad().to_vector<double>();
    double* data = p.data<double>();
    for (int64_t j = 0; j < p.numel(); j += stride) {
      const double saved = data[j];
      NoGradGuard no_grad;
      data[j] = saved + eps;
      const double plus = model.loss(batch.tokens, batch.targets).item();
      data[j] = saved - eps;
      const double minus = model.loss(batch.tokens, batch.targets).item();
      data[j] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      ASSERT_NEAR(analytic[j], numeric, 1e-7 * (1 + std::abs(numeric))) << name << "[" << j << "]";
    }
  }
}

// `plain` and `recomputed`: the same f32 model and weights, the second checkpointing its
// blocks' activations.
// The forward runs under `autocast` (F32: off) and the backward outside it, as the strategies
// run them: the recomputation must repeat the forward's precision, not the backward's.
inline void expect_checkpointing_bitwise(CausalLM& plain, CausalLM& recomputed,
                                         DType autocast = DType::F32) {
  const Batch batch = tiny_batch();
  Tensor l1, l2;
  {
    AutocastGuard guard(autocast);
    l1 = plain.loss(batch.tokens, batch.targets);
    l2 = recomputed.loss(batch.tokens, batch.targets);
  }
  EXPECT_EQ(l1.item(), l2.item());
  l1.backward();
  l2.backward();
  auto a = plain.named_parameters(), b = recomputed.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].second.grad().to_vector<float>(), b[i].second.grad().to_vector<float>())
        << a[i].first;
  }
}

}  // namespace loom::nn::testing
