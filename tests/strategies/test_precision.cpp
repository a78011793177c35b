// Precision policies: autocast rounding of matmul/linear, the dynamic loss scaler, and
// bf16-mixed / 16-mixed training through the strategy.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "nn/gpt.h"
#include "optim/adamw.h"
#include "strategies/fabric.h"
#include "strategies/registry.h"
#include "tensor/autocast.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tiny_training.h"

namespace loom::strategies {
namespace {

std::vector<float> rounded(const Tensor& t, DType dtype) {
  return t.to(dtype).to(DType::F32).to_vector<float>();
}

// Autocast's weight cache (WeightCastScope, tensor/autocast.h) over a step of two
// micro-batches of a GPT whose blocks are checkpointed, under bf16 autocast (which the CPU
// computes in), forward inside autocast and backward outside, as train_gpt runs them.
nn::GPTConfig checkpointed_gpt(Device device) {
  nn::GPTConfig c;
  c.vocab_size = 11;
  c.context = 6;
  c.layers = 2;
  c.heads = 2;
  c.embd = 8;
  c.checkpoint_activations = true;
  c.options.device = device;
  return c;
}

// The "cast" ops of each micro-batch, when a sink is installed (meta).
struct CastCounter final : MetaCostSink {
  std::vector<int> per_micro_batch;
  void record(const OpCost& cost) override {
    if (std::string_view(cost.op) == "cast") ++per_micro_batch.back();
  }
};

void micro_batches(nn::GPT& model, int count, CastCounter* casts = nullptr) {
  const Device device = model.parameters().front().device();
  const Tensor tokens =
      Tensor::from_vector<int64_t>({1, 4, 7, 2, 9, 3, 5, 0, 10, 6}, {2, 5}).to(device);
  const Tensor targets =
      Tensor::from_vector<int64_t>({4, 7, 2, 9, 3, 8, 0, 10, 6, 1}, {2, 5}).to(device);
  for (int k = 0; k < count; ++k) {
    if (casts != nullptr) casts->per_micro_batch.push_back(0);
    Tensor loss;
    {
      AutocastGuard bf16(DType::BF16);
      loss = model.loss(tokens, targets);
    }
    loss.backward();
  }
}

TEST(WeightCastScope, GivesBitwiseTheGradientsOfCastingEachTime) {
  nn::GPT plain(checkpointed_gpt(Device::cpu()), 3), cached(checkpointed_gpt(Device::cpu()), 3);
  micro_batches(plain, 2);
  {
    WeightCastScope scope(cached.parameters());
    micro_batches(cached, 2);
    EXPECT_GT(scope.cached_casts(), 0u);
  }
  const auto a = plain.named_parameters(), b = cached.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].second.grad().defined()) << a[i].first;
    EXPECT_EQ(a[i].second.grad().to_vector<float>(), b[i].second.grad().to_vector<float>())
        << a[i].first;
  }
}

// Under autocast the products write the gradients of their f32 weights in f32 (Note [Weight
// gradients in f32] in tensor/autocast.cpp): the f32 sums a bf16 product would round, kept.
// Rounded to bf16 they are the gradients of the same products of bf16 leaves (as PyTorch's
// autocast gives them); unrounded, they hold values bf16 cannot. A weight used directly
// (linear's [in, out]) and one used transposed (x @ w^T, as Llama and the tied head use them).
TEST(Autocast, ProductsWriteTheirWeightsGradientsUnrounded) {
  Generator gen(5);
  Tensor x = Tensor::empty({6, 40}), w = Tensor::empty({40, 24}), b = Tensor::empty({24}),
         wt = Tensor::empty({24, 40});
  for (Tensor* t : {&x, &w, &b, &wt})
    uniform_(*t, -1.0, 1.0, gen);
  Tensor lows[3] = {w.to(DType::BF16), b.to(DType::BF16), wt.to(DType::BF16)};
  for (Tensor* t : {&w, &b, &wt, &lows[0], &lows[1], &lows[2]})
    t->set_requires_grad(true);
  {
    AutocastGuard bf16(DType::BF16);
    sum(cast(add(linear(x, w, b), matmul(x, transpose(wt, 0, 1))), DType::F32)).backward();
  }
  const Tensor xb = x.to(DType::BF16);
  sum(cast(add(linear(xb, lows[0], lows[1]), matmul(xb, transpose(lows[2], 0, 1))), DType::F32))
      .backward();
  const std::pair<Tensor, Tensor> pairs[] = {{w, lows[0]}, {b, lows[1]}, {wt, lows[2]}};
  int unrounded = 0;
  for (const auto& [f32, low] : pairs) {
    ASSERT_EQ(f32.grad().dtype(), DType::F32);
    ASSERT_EQ(low.grad().dtype(), DType::BF16);
    EXPECT_EQ(rounded(f32.grad(), DType::BF16), low.grad().to(DType::F32).to_vector<float>());
    unrounded += rounded(f32.grad(), DType::BF16) != f32.grad().to_vector<float>();
  }
  EXPECT_EQ(unrounded, 2);  // the weights' (the bias's sums of 6 ones are exact in bf16)
}

// Without the cache each block's four weights and four biases are cast twice per micro-batch
// (the checkpointed forward and its recomputation) and the tied classifier's weight once, and
// none of the 17 gradients is cast back to f32: 33 casts. With it, each of the 17 is
// cast once in the first micro-batch. Neither casts a gradient back: the products write them in
// f32 (Note [Weight gradients in f32]), taken or added by the accumulation. The activations'
// casts are the same in both.
TEST(WeightCastScope, CastsEachWeightOncePerScope) {
  CastCounter plain_casts, cached_casts;
  nn::GPT plain(checkpointed_gpt(Device::meta()), 3), cached(checkpointed_gpt(Device::meta()), 3);
  {
    MetaCostScope sink(plain_casts);
    micro_batches(plain, 2, &plain_casts);
  }
  size_t weights = 0;
  {
    MetaCostScope sink(cached_casts);
    WeightCastScope scope(cached.parameters());
    micro_batches(cached, 2, &cached_casts);
    weights = scope.cached_casts();
  }
  const int in_blocks = 2 * 8, tied = 1;
  EXPECT_EQ(weights, static_cast<size_t>(in_blocks + tied));
  const std::vector<int>& p = plain_casts.per_micro_batch;
  const std::vector<int>& c = cached_casts.per_micro_batch;
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(p[0], p[1]);
  EXPECT_EQ(c[0] - c[1], in_blocks + tied);  // the weights' casts
  EXPECT_EQ(p[1] - c[1], 2 * in_blocks + tied);
}

// Views of a parameter (a transposed weight, as Llama's projections use theirs) are cached
// apiece, with the values casting gives; a tensor the scope was not given is cast each time.
TEST(WeightCastScope, CachesItsParametersAndTheirViewsOnly) {
  Tensor w = Tensor::from_vector<float>({1.001f, 2.003f, -0.7071f, 3.14159f}, {2, 2});
  Tensor x = Tensor::from_vector<float>({0.5f, -1.5f}, {1, 2});
  std::vector<float> uncached, uncached_transposed;
  {
    AutocastGuard bf16(DType::BF16);
    uncached = matmul(x, w).to_vector<float>();
    uncached_transposed = matmul(x, transpose(w, 0, 1)).to_vector<float>();
  }
  WeightCastScope scope({w});
  AutocastGuard bf16(DType::BF16);
  for (int use = 0; use < 2; ++use) {
    EXPECT_EQ(matmul(x, w).to_vector<float>(), uncached);
    EXPECT_EQ(matmul(x, transpose(w, 0, 1)).to_vector<float>(), uncached_transposed);
  }
  EXPECT_EQ(scope.cached_casts(), 2u);
  matmul(x, w.clone());
  EXPECT_EQ(scope.cached_casts(), 2u);
}

// AccumulateGrad adds a cached weight cast's 16-bit gradient into the f32 one with add_,
// widening on load: the values of adding its f32 cast, in one op.
TEST(Autocast, AddOfA16BitTensorIntoF32IsTheSumOfItsF32Cast) {
  Generator gen(9);
  for (DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor a = Tensor::empty({3, 37}), b32 = Tensor::empty({3, 37});
    uniform_(a, -2.0, 2.0, gen);
    uniform_(b32, -2.0, 2.0, gen);
    const Tensor b = b32.to(low);
    Tensor fused = a.clone(), want = a.clone();
    add_(fused, b);
    add_(want, b.to(DType::F32));
    EXPECT_EQ(fused.to_vector<float>(), want.to_vector<float>());
    Tensor wrong_shape = Tensor::zeros({37, 3}, low);
    EXPECT_THROW(add_(fused, wrong_shape), Error);
  }
}

// A bf16 result meeting the f32 residual stream is added in one pass (Note [An f32 tensor plus
// a 16-bit one] in elementwise.cpp): the values of casting it first, either operand order, and
// the 16-bit operand's gradient in its own dtype.
TEST(Autocast, AddOfF32AndA16BitTensorIsThePromotedSum) {
  Generator gen(11);
  for (DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    Tensor residual = Tensor::empty({4, 9}), wide = Tensor::empty({4, 9});
    uniform_(residual, -2.0, 2.0, gen);
    uniform_(wide, -2.0, 2.0, gen);
    residual.set_requires_grad(true);
    const Tensor narrow = wide.to(low).set_requires_grad(true);
    const Tensor want = add(residual.detach(), narrow.detach().to(DType::F32));
    for (bool f32_first : {true, false}) {
      const Tensor sum = f32_first ? add(residual, narrow) : add(narrow, residual);
      EXPECT_EQ(sum.dtype(), DType::F32);
      EXPECT_EQ(sum.to_vector<float>(), want.to_vector<float>());
      loom::sum(mul(sum, 3.0)).backward();
    }
    EXPECT_EQ(narrow.grad().dtype(), low);
    EXPECT_EQ(narrow.grad().to_vector<float>(), std::vector<float>(36, 6.0f));
    EXPECT_EQ(residual.grad().to_vector<float>(), std::vector<float>(36, 6.0f));
    // An f32 bias over the rows (the tensor-parallel layers add theirs so): the same.
    Tensor bias = Tensor::empty({9});
    uniform_(bias, -1.0, 1.0, gen);
    bias.set_requires_grad(true);
    const Tensor with_bias = add(narrow, bias);
    EXPECT_EQ(with_bias.to_vector<float>(),
              add(narrow.detach().to(DType::F32), bias.detach()).to_vector<float>());
    loom::sum(with_bias).backward();
    EXPECT_EQ(bias.grad().to_vector<float>(), std::vector<float>(9, 4.0f));
  }
}

TEST(Autocast, MatmulRoundsOperandsAndResult) {
  Tensor a = Tensor::from_vector<float>({1.001f, 2.003f, -0.7071f, 3.14159f}, {2, 2});
  Tensor b = Tensor::from_vector<float>({0.333f, 1.0f / 7, 2.5f, -1.1f}, {2, 2});
  Tensor want = matmul(a.to(DType::BF16).to(DType::F32), b.to(DType::BF16).to(DType::F32));
  Tensor got;
  {
    AutocastGuard guard(DType::BF16);
    got = matmul(a, b);
  }
  EXPECT_EQ(got.dtype(), DType::BF16);
  EXPECT_EQ(got.to_vector<float>(), rounded(want, DType::BF16));
  EXPECT_NE(got.to_vector<float>(), matmul(a, b).to_vector<float>());  // f32 outside the scope
  EXPECT_EQ(autocast_dtype(), DType::F32);
}

// PyTorch's autocast lists (tensor/autocast.h): a matmul's result stays bf16 through GELU into
// the next matmul, becomes f32 where it meets the f32 residual, and the normalisations and the
// loss take it in f32. The gradients come back in each tensor's own dtype.
TEST(Autocast, ResultsStayBf16UntilTheResidualOrAnF32Op) {
  Generator gen(5);
  auto random = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape);
    uniform_(t, -1.0, 1.0, gen);
    return t.set_requires_grad(true);
  };
  Tensor x = random({4, 8}), w1 = random({8, 16}), b1 = random({16}), w2 = random({16, 8}),
         b2 = random({8}), gain = random({8}), shift = random({8});
  AutocastGuard guard(DType::BF16);
  Tensor hidden = linear(x, w1, b1);
  EXPECT_EQ(hidden.dtype(), DType::BF16);
  Tensor activated = gelu(hidden);
  EXPECT_EQ(activated.dtype(), DType::BF16);
  Tensor projected = linear(activated, w2, b2);
  EXPECT_EQ(projected.dtype(), DType::BF16);
  // The second product took GELU's bf16 result as it was: the same bits as from its f32 copy.
  EXPECT_EQ(projected.to_vector<float>(),
            linear(activated.to(DType::F32), w2, b2).to_vector<float>());
  Tensor residual = add(x, projected);
  EXPECT_EQ(residual.dtype(), DType::F32);
  EXPECT_EQ(layer_norm(projected, gain, shift).dtype(), DType::F32);
  EXPECT_EQ(softmax(projected).dtype(), DType::F32);
  Tensor q = reshape(projected, {1, 1, 4, 8});
  EXPECT_EQ(causal_attention(q, q, q).dtype(), DType::BF16);
  Tensor loss = cross_entropy(projected, Tensor::from_vector<int64_t>({0, 1, 2, 3}, {4}));
  EXPECT_EQ(loss.dtype(), DType::F32);
  add(loss, sum(layer_norm(residual, gain, shift))).backward();
  for (const Tensor* p : {&x, &w1, &b1, &w2, &b2, &gain, &shift}) {
    ASSERT_TRUE(p->grad().defined());
    EXPECT_EQ(p->grad().dtype(), DType::F32);
  }
}

TEST(Autocast, GradientsFlowThroughTheRoundings) {
  Tensor x = Tensor::from_vector<float>({0.5f, -1.25f, 2.0f}, {1, 3}).set_requires_grad(true);
  Tensor w = Tensor::full({3, 2}, 0.5).set_requires_grad(true);
  Tensor b = Tensor::zeros({2}).set_requires_grad(true);
  {
    AutocastGuard guard(DType::F16);
    sum(linear(x, w, b)).backward();
  }
  // d/dx sum(x w + b) = row sums of w = 1.0; d/db = 1; d/dw = x (each column); all exact in f16.
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>({1, 1, 1}));
  EXPECT_EQ(b.grad().to_vector<float>(), std::vector<float>({1, 1}));
  EXPECT_EQ(w.grad().to_vector<float>(), std::vector<float>({0.5f, 0.5f, -1.25f, -1.25f, 2, 2}));
}

// bf16 autocast on the CPU computes linear in bf16 (tensor/autocast.h): the result is the
// exact product of the bf16-rounded operands plus the bf16 bias, rounded to bf16 once; the
// input's gradient is a bf16 product of the bf16-rounded incoming gradient, as PyTorch's
// autocast computes it, and the weight's and bias's are the same sums left in f32 (Note
// [Weight gradients in f32]). Within one rounding (half a unit in the 8th bit) where rounded,
// and f32 sums.
TEST(Autocast, Bf16LinearOnTheCpuRoundsOnceForwardAndBackward) {
  const int64_t rows = 33, in = 40, out = 50;
  Generator gen(11);
  auto random = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape);
    uniform_(t, -1.0, 1.0, gen);
    return t;
  };
  Tensor x = random({rows, in}).set_requires_grad(true), w = random({in, out}).set_requires_grad(true),
         b = random({out}).set_requires_grad(true), g = random({rows, out});
  Tensor y;
  {
    AutocastGuard guard(DType::BF16);
    y = linear(x, w, b);
  }
  sum(mul(y, g)).backward();
  // The references in f64 from the bf16-rounded operands.
  auto bf16 = [](const Tensor& t) { return t.to(DType::BF16).to(DType::F64); };
  const Tensor xb = bf16(x.detach()), wb = bf16(w.detach()), bb = bf16(b.detach()), gb = bf16(g);
  const Tensor want_y = add(matmul(xb, wb), bb), want_dx = matmul(gb, transpose(wb, 0, 1)),
               want_dw = matmul(transpose(xb, 0, 1), gb), want_db = sum(gb, {0});
  auto expect_sums = [&](const Tensor& got, const Tensor& want, const Tensor& magnitude,
                         int64_t terms, bool rounded_once, const char* what) {
    const auto gv = got.to(DType::F64).to_vector<double>(), wv = want.to_vector<double>(),
               mv = magnitude.to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < gv.size(); ++i) {
      const double bound = std::abs(wv[i]) * (rounded_once ? std::ldexp(1.0, -8) : 0.0) +
                           double(terms + 1) * std::ldexp(1.0, -23) * mv[i];
      worst = std::max(worst, std::abs(gv[i] - wv[i]) / bound);
    }
    EXPECT_LE(worst, 1.0) << what;
    const bool bf16_values =
        bf16(got).to_vector<double>() == got.to(DType::F64).to_vector<double>();
    EXPECT_EQ(bf16_values, rounded_once) << what;
  };
  auto abs = [](const Tensor& t) {
    std::vector<double> v = t.contiguous().to_vector<double>();
    for (double& e : v)
      e = std::abs(e);
    return Tensor::from_vector<double>(v, t.shape());
  };
  expect_sums(y, want_y, add(matmul(abs(xb), abs(wb)), abs(bb)), in, true, "y");
  expect_sums(x.grad(), want_dx, matmul(abs(gb), transpose(abs(wb), 0, 1)), out, true, "dx");
  expect_sums(w.grad(), want_dw, matmul(transpose(abs(xb), 0, 1), abs(gb)), rows, false, "dw");
  expect_sums(b.grad(), want_db, sum(abs(gb), {0}), rows, false, "db");
}

TEST(LossScaler, SkipsNonFiniteStepsAndAdjustsTheScale) {
  LossScaler scaler({.initial_scale = 8, .growth = 2, .backoff = 0.5, .growth_interval = 2});
  Tensor p = Tensor::zeros({2}).set_requires_grad(true);
  p.set_grad(Tensor::from_vector<float>({8, 16}, {2}));
  scaler.unscale({p});
  EXPECT_FALSE(scaler.found_inf());
  EXPECT_EQ(p.grad().to_vector<float>(), std::vector<float>({1, 2}));
  scaler.update();
  scaler.update();  // two clean steps: grows
  EXPECT_EQ(scaler.scale(), 16);
  p.set_grad(Tensor::from_vector<float>({INFINITY, 1}, {2}));
  scaler.unscale({p});
  EXPECT_TRUE(scaler.found_inf());
  scaler.update();
  EXPECT_EQ(scaler.scale(), 8);
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

// The inf/NaN check every loss-scaled step runs: any inf, -inf or NaN anywhere, and nothing
// else (the largest finite values included); a meta tensor, which has no values, has none.
TEST(LossScaler, AnyNonFiniteFindsInfAndNanAndNothingElse) {
  const float big = std::numeric_limits<float>::max();
  EXPECT_FALSE(any_non_finite(Tensor::from_vector<float>({big, -big, 0.0f, -0.0f, 1e-45f}, {5})));
  for (float bad : {INFINITY, -INFINITY, NAN}) {
    std::vector<float> values(1000, big);
    values[777] = bad;
    EXPECT_TRUE(any_non_finite(Tensor::from_vector<float>(values, {10, 100}))) << bad;
  }
  EXPECT_TRUE(any_non_finite(Tensor::from_vector<double>({1.0, NAN}, {2})));
  EXPECT_FALSE(any_non_finite(Tensor::empty({4, 4}, DType::F32, Device::meta())));
}

TEST(Precision, MixedTrainingStaysCloseToF32AndSkipsOverflowingSteps) {
  using testing::tiny_corpus;
  auto run = [](const std::string& precision, double* scale_out) {
    StrategyOptions options;  // (named: GCC 12 misreports a designated temporary here)
    options.precision = precision;
    auto strategy = StrategyRegistry::create("single_device", options);
    nn::GPTConfig c = testing::tiny_gpt_config(DType::F32);
    nn::GPT model(c, 2);
    train_gpt::TrainOptions o;
    o.model = c;
    o.batch = 4;
    o.steps = 20;
    o.lr = 3e-3;
    data::TokenBlocks data(tiny_corpus(), 4, testing::kTinyContext, testing::kTinyVocab);
    double last = 0;
    train_gpt::train(
        model, data, o, [&](const train_gpt::StepMetrics& m) { last = m.loss; }, strategy.get());
    if (scale_out) *scale_out = strategy->loss_scaler() ? strategy->loss_scaler()->scale() : 0;
    return last;
  };
  double f32 = run("32-true", nullptr);
  double bf16 = run("bf16-mixed", nullptr);
  double scale = 0;
  double f16 = run("16-mixed", &scale);
  EXPECT_NE(bf16, f32);  // the roundings are real
  EXPECT_NEAR(bf16, f32, 0.05 * f32);
  EXPECT_NEAR(f16, f32, 0.1 * f32);
  EXPECT_GT(scale, 0);
  StrategyOptions eight_bit;
  eight_bit.precision = "8-true";
  EXPECT_THROW(StrategyRegistry::create("single_device", eight_bit), Error);
}

// A user precision policy: bf16 rounding with a loss scaler.
class ScaledBf16 : public Precision {
 public:
  std::string name() const override { return "scaled-bf16"; }
  DType compute_dtype() const override { return DType::BF16; }
  std::unique_ptr<LossScaler> make_scaler() const override {
    return std::make_unique<LossScaler>(LossScalerOptions{.initial_scale = 1024});
  }
};

TEST(Precision, UserPoliciesReplaceTheBuiltIns) {
  auto strategy = StrategyRegistry::create("single_device");
  EXPECT_EQ(strategy->compute_dtype(), DType::F32);
  EXPECT_EQ(strategy->loss_scaler(), nullptr);
  strategy->set_precision(std::make_shared<ScaledBf16>());
  EXPECT_EQ(strategy->compute_dtype(), DType::BF16);
  ASSERT_NE(strategy->loss_scaler(), nullptr);
  EXPECT_EQ(strategy->loss_scaler()->scale(), 1024);
  EXPECT_EQ(make_precision("16-mixed")->compute_dtype(), DType::F16);
  EXPECT_THROW(make_precision("fp8"), Error);
}

TEST(Precision, FabricAppliesAutocastAndTheLossScaler) {
  Fabric fabric({.precision = "16-mixed"});
  fabric.launch();
  nn::GPTConfig c = testing::tiny_gpt_config(DType::F32);
  nn::GPT model(c, 2);
  optim::AdamW optimizer(model.parameters(), {.lr = 3e-3, .weight_decay = 0});
  fabric.setup_module(model);
  fabric.setup_optimizer(optimizer);
  data::TokenBlocks data(testing::tiny_corpus(), 4, testing::kTinyContext,
                              testing::kTinyVocab);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    data::Batch b = data.for_step(step);
    Tensor loss;
    {
      auto guard = fabric.autocast();
      EXPECT_EQ(autocast_dtype(), DType::F16);
      loss = model.loss(b.tokens, b.targets);
    }
    fabric.backward(loss);
    fabric.clip_gradients(model, 1.0);
    fabric.step(optimizer);
    optimizer.zero_grad();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_EQ(autocast_dtype(), DType::F32);
  EXPECT_LT(last, first - 0.5);
  ASSERT_NE(fabric.strategy().loss_scaler(), nullptr);
  EXPECT_GT(fabric.strategy().loss_scaler()->scale(), 0);
}

}  // namespace
}  // namespace loom::strategies
