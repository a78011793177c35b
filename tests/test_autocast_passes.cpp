// Autocast's casts on the CUDA path, counted (issue 46's cast budget): a GPT-2 and a Llama
// training step of two micro-batches under bf16-mixed on the meta device following CUDA's
// code path (the ops a GPU would run: tensor/meta.h), inside a WeightCastScope as train_gpt
// holds one over a step. What a step casts:
//  - weights: each parameter view autocast reads, once per step (the cache); their gradients
//    never: the products write them in f32 (Note [Weight gradients in f32] in autocast.cpp);
//  - activations: none. The norms write their products' bf16 inputs themselves
//    (nn::NormOutput), the residual add before a block's second norm gives the attention
//    branch its bf16 gradient in the same pass (add_layer_norm, add_rms_norm), and each
//    block's first norm (and the model's final one) writes the MLP branch's in its pass,
//    taking over the residual add in front of it (Note [A norm takes over the residual add
//    before it]).

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/gpt.h"
#include "nn/llama.h"
#include "tensor/autocast.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace loom {
namespace {

constexpr int64_t kBatch = 3, kTime = 5;  // 15 rows: no parameter's size is a multiple of 5

// A step's casts by what they cast, told apart by their sizes: activations (and their
// gradients) are multiples of kBatch * kTime elements, position tables (Llama's rotary cos and
// sin, [kTime, head dim]) of kTime, parameters neither.
class CastCounts final : public MetaCostSink {
 public:
  void record(const OpCost& cost) override {
    const int64_t elements = cost.dims[0];
    const bool parameter_sized = elements % kTime != 0;
    if (std::string(cost.op) == "copy_" && parameter_sized) ++parameter_copies;
    if (std::string(cost.op) != "cast") return;
    if (elements % (kBatch * kTime) == 0) ++activations;
    else if (elements % kTime == 0) ++position_tables;
    else ++parameters;
  }
  int64_t activations = 0, position_tables = 0, parameters = 0;
  int64_t parameter_copies = 0;  // same-dtype copies of parameter-sized tensors
};

// The casts of one step of `micro_batches` on a fresh model, and the weights it cast.
CastCounts step_casts(const std::function<std::unique_ptr<nn::CausalLM>()>& make,
                      int micro_batches, size_t& cached_weights) {
  const std::unique_ptr<nn::CausalLM> model = make();
  CastCounts counts;
  MetaCudaPathScope cuda;
  MetaCostScope scope(counts);
  AutocastGuard autocast(DType::BF16);
  WeightCastScope weights(model->parameters());
  const Tensor tokens = Tensor::zeros({kBatch, kTime}, DType::I64, Device::meta());
  for (int i = 0; i < micro_batches; ++i)
    model->loss(tokens, tokens).backward();
  cached_weights = weights.cached_casts();
  return counts;
}

// A GPT-2 of `layers` blocks, 16 wide, on `device`.
nn::GPTConfig small_gpt(int64_t layers, Device device) {
  nn::GPTConfig c;
  c.vocab_size = 64;
  c.context = 8;
  c.layers = layers;
  c.heads = 2;
  c.embd = 16;
  c.options.device = device;
  return c;
}

// Per block and micro-batch: `activations_per_block` activation casts, `tables_per_block`
// position tables.
void expect_the_budget(const std::function<std::unique_ptr<nn::CausalLM>()>& make,
                       int64_t activations_per_block, int64_t tables_per_block) {
  const int64_t blocks = make()->blocks();
  for (const int micro_batches : {1, 2}) {
    SCOPED_TRACE(std::to_string(micro_batches) + " micro-batches");
    size_t cached_weights = 0;
    const CastCounts casts = step_casts(make, micro_batches, cached_weights);
    EXPECT_GT(cached_weights, 0u);
    // Each weight cast once however many micro-batches, its gradient never; a transposed
    // weight (x @ weight^T) in its own layout both ways, so never copied.
    EXPECT_EQ(casts.parameters, static_cast<int64_t>(cached_weights));
    EXPECT_EQ(casts.parameter_copies, 0);
    EXPECT_EQ(casts.activations, activations_per_block * blocks * micro_batches);
    EXPECT_EQ(casts.position_tables, tables_per_block * blocks * micro_batches);
  }
}

TEST(AutocastPasses, AGpt2StepCastsEachWeightOnceAndNoActivation) {
  const nn::GPTConfig c = small_gpt(3, Device::meta());
  expect_the_budget([c] { return std::make_unique<nn::GPT>(c, 0); }, 0, 0);
}

// Llama's blocks read the rotary tables in f32 and convert them as they rotate: no table casts.
TEST(AutocastPasses, ALlamaStepCastsEachWeightOnceAndNoActivation) {
  nn::LlamaConfig c;
  c.vocab_size = 64;
  c.context = 8;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.hidden = 16;
  c.intermediate = 24;
  c.options.device = Device::meta();
  expect_the_budget([c] { return std::make_unique<nn::Llama>(c, 0); }, 0, 0);
}

// With a WeightCastPlan (train_gpt keeps one), a step's scope casts every weight the step before
// cast in one op at its first cast (one launch on CUDA), and keeps the same cache.
TEST(AutocastPasses, AStepWithThePreviousStepsPlanCastsItsWeightsInOneOp) {
  nn::GPT model(small_gpt(2, Device::meta()), 0);
  const Tensor tokens = Tensor::zeros({kBatch, kTime}, DType::I64, Device::meta());
  WeightCastPlan plan;
  MetaCudaPathScope cuda;
  AutocastGuard autocast(DType::BF16);
  size_t cached[2] = {0, 0};
  for (int step = 0; step < 2; ++step) {
    for (const Tensor& p : model.parameters())
      p.set_grad(Tensor());  // as the optimizer's zero_grad leaves them
    CastCounts counts;
    {
      MetaCostScope scope(counts);
      WeightCastScope weights(model.parameters(), &plan);
      model.loss(tokens, tokens).backward();
      cached[step] = weights.cached_casts();
    }
    const auto weights = static_cast<int64_t>(cached[step]);
    // The first step casts each weight alone; the second all of them in one op. Neither casts
    // a gradient.
    EXPECT_EQ(counts.parameters, step == 0 ? weights : 1) << "step " << step;
    EXPECT_EQ(plan.size(), cached[step]);
  }
  EXPECT_EQ(cached[1], cached[0]);
}

// On the CPU (which casts the plan's weights one after another) the bits of casting each at
// its first use: losses and every gradient.
TEST(AutocastPasses, CastingAPlansWeightsTogetherKeepsTheBitsOnTheCpu) {
  const nn::GPTConfig c = small_gpt(2, Device::cpu());
  nn::GPT planned(c, 3), alone(c, 3);
  std::vector<int64_t> values(kBatch * kTime);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<int64_t>(i * 7 % 64);
  const Tensor tokens = Tensor::from_vector(values, {kBatch, kTime});
  WeightCastPlan plan;
  AutocastGuard autocast(DType::BF16);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    double losses[2];
    for (nn::GPT* model : {&planned, &alone}) {
      for (Tensor& p : model->parameters())
        p.set_grad(Tensor());
      WeightCastScope weights(model->parameters(), model == &planned ? &plan : nullptr);
      const Tensor loss = model->loss(tokens, tokens);
      loss.backward();
      losses[model == &planned ? 0 : 1] = loss.item();
    }
    EXPECT_EQ(losses[0], losses[1]);
    const std::vector<Tensor> a = planned.parameters(), b = alone.parameters();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_EQ(a[i].grad().to_vector<float>(), b[i].grad().to_vector<float>())
          << "parameter " << i;
  }
  EXPECT_GT(plan.size(), 0u);
}

}  // namespace
}  // namespace loom
