// The whole tensor library on the emulated CUDA device (docs/cuda.md, "Kernel emulation"): a
// small GPT-2 and a small Llama train through Loom's CUDA code path (the ops' CUDA dispatch, the
// device runtime, the caching allocator, every kernel rewritten for the emulator, the CUDA matmul
// answered by the cuBLASLt stand-in), and the device's work is counted (runtime/work_log.h).
//
// What it establishes: the CUDA path as a whole computes what the CPU path computes (each
// kernel's own tests compare it with its CPU twin; this compares whole training steps), and
// a step's launches against issue 46's budgets: per layer (forward and backward), the
// optimizer step's (gradient norm, clipping, AdamW) and the casts. The budgets met are asserted
// as the issue states them (the per-layer one, 25, met since 2026-12-06).

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "device_allocations.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "runtime/cublaslt_standin.h"
#include "runtime/work_log.h"
#include "tensor/autocast.h"
#include "tensor/autograd/function.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tools/train_gpt/graphed_step.h"

namespace loom {
namespace {

namespace emu = cuda_emulation;

constexpr int64_t kBatch = 2, kTime = 16, kVocab = 64;

std::unique_ptr<nn::CausalLM> tiny_gpt(int layers) {
  nn::GPTConfig c;
  c.vocab_size = kVocab;
  c.context = kTime;
  c.layers = layers;
  c.heads = 2;
  c.embd = 32;
  return std::make_unique<nn::GPT>(c, 7);
}

// Grouped-query attention (4 query heads, 2 key/value heads), SwiGLU, rotary positions.
std::unique_ptr<nn::CausalLM> tiny_llama(int layers) {
  nn::LlamaConfig c;
  c.vocab_size = kVocab;
  c.context = kTime;
  c.layers = layers;
  c.heads = 4;
  c.kv_heads = 2;
  c.hidden = 32;
  c.intermediate = 48;
  return std::make_unique<nn::Llama>(c, 7);
}

using ModelMaker = std::unique_ptr<nn::CausalLM> (*)(int layers);

Tensor random_tokens(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, kVocab - 1);
  std::vector<int64_t> values(kBatch * kTime);
  for (int64_t& v : values)
    v = token(rng);
  return Tensor::from_vector(values, {kBatch, kTime});
}

// What one training step did.
struct Step {
  double loss = 0, grad_norm = 0;
  size_t forward_backward_launches = 0, optimizer_launches = 0;
  size_t step_launches = 0, step_host_launches = 0;  // graphed: kernels run, and launched
  size_t casts = 0, batched_casts = 0, matmuls = 0;  // launches of the forward and backward
  size_t copies = 0;  // the forward and backward's copies on the device (not launches)
  size_t cached_weights = 0;                         // autocast's weight casts (bf16-mixed)
  std::vector<emu::Work> forward_backward;           // the emulated device's work, in order
  // The forward and backward's bytes: on the emulated device, their launches' argument bytes
  // (Note [The bytes a launch's arguments name]); on meta, what its ops report read and
  // written (loom-sim's cost inputs). In all, the products' and the weight casts'.
  struct Bytes {
    double all = 0, products = 0, weight_casts = 0;
  } bytes;
};

double argument_bytes_named(const std::vector<emu::Work>& work, const std::string& prefix) {
  double bytes = 0;
  for (const emu::Work& w : work)
    if (w.name.compare(0, prefix.size(), prefix) == 0)
      bytes += static_cast<double>(w.argument_bytes);
  return bytes;
}

size_t count_named(const std::vector<emu::Work>& work, const std::string& prefix) {
  return static_cast<size_t>(std::count_if(work.begin(), work.end(), [&](const emu::Work& w) {
    return w.name.compare(0, prefix.size(), prefix) == 0;
  }));
}

// A model and its AdamW on one device, stepped as train_gpt steps them: under bf16-mixed,
// autocast and a WeightCastScope over the forward and backward; the loss's gradient announced
// (Strategy::forward_backward's LossGradientScope); gradients clipped to norm 1;
// with `cuda_graph`, the whole step through train_gpt's GraphedStep (--cuda-graph): the
// clipping factor on the device, AdamW capturable.
class Trainer {
 public:
  Trainer(ModelMaker make, int layers, Device device, bool bf16_mixed, bool cuda_graph = false)
      : model_(make(layers)), bf16_mixed_(bf16_mixed), device_(device) {
    model_->to(device);
    optimizer_ = std::make_unique<optim::AdamW>(model_->parameters());
    if (cuda_graph) {
      graphed_ = std::make_unique<train_gpt::GraphedStep>(device);
      optimizer_->set_capturable(true);
    }
  }

  std::vector<std::vector<float>> parameter_values() const {
    std::vector<std::vector<float>> values;
    for (const Tensor& p : model_->parameters())
      values.push_back(p.to(Device::cpu()).to_vector<float>());
    return values;
  }

  Step step(uint64_t data_seed) { return step_with(data_seed, &plan_); }
  // As train_gpt stepped before it kept a WeightCastPlan: each weight cast at its first use.
  Step step_without_a_plan(uint64_t data_seed) { return step_with(data_seed, nullptr); }

 private:
  Step step_with(uint64_t data_seed, WeightCastPlan* plan) {
    if (graphed_) return graphed_step(data_seed, plan);
    const Tensor tokens = random_tokens(data_seed).to(device_);
    const Tensor targets = random_tokens(data_seed + 1).to(device_);
    Step s;
    emu::WorkLog log(emu::device_allocation);
    MetaCostTotals meta_costs;
    {
      std::unique_ptr<MetaCostScope> meta_scope;
      std::unique_ptr<MetaCudaPathScope> meta_path;
      if (device_.is_meta()) {
        meta_scope = std::make_unique<MetaCostScope>(meta_costs);
        meta_path = std::make_unique<MetaCudaPathScope>();
      }
      std::unique_ptr<AutocastGuard> autocast;
      std::unique_ptr<WeightCastScope> weights;
      if (bf16_mixed_) {
        autocast = std::make_unique<AutocastGuard>(DType::BF16);
        weights = std::make_unique<WeightCastScope>(model_->parameters(), plan);
      }
      Tensor loss;
      {
        LossGradientScope loss_gradient(1.0);  // as Strategy::forward_backward announces it
        loss = model_->loss(tokens, targets);
      }
      loss.backward();
      s.loss = loss.item();
      if (weights) s.cached_weights = weights->cached_casts();
    }
    const std::vector<emu::Work> forward_backward = log.entries();
    s.forward_backward_launches = log.launches();
    if (device_.is_meta()) {
      auto traffic = [](const MetaCostTotals::Sum& sum) {
        return sum.bytes_read + sum.bytes_written;
      };
      s.bytes = {traffic(meta_costs.total()), traffic(meta_costs.of(OpClass::Gemm)),
                 traffic(meta_costs.by_op().at("cast"))};
    } else {
      s.bytes = {static_cast<double>(log.argument_bytes()),
                 argument_bytes_named(forward_backward, "cublasLtMatmul"),
                 argument_bytes_named(forward_backward, "multi_cast")};
    }
    s.casts = count_named(forward_backward, "convert");
    s.batched_casts = count_named(forward_backward, "multi_cast");
    s.matmuls = count_named(forward_backward, "cublasLtMatmul");
    s.copies = count_named(forward_backward, "cudaMemcpy");
    s.forward_backward = forward_backward;
    log.clear();
    s.grad_norm = optim::clip_grad_norm(model_->parameters(), 1.0);
    optimizer_->step();
    optimizer_->zero_grad();
    s.optimizer_launches = log.launches();
    return s;
  }

  // As train_gpt's graphed_step: the whole step run, captured or replayed. The step drops the
  // previous gradients first, so the captured backward writes them anew, and keeps its own:
  // a replay rewrites them, and prepare_replay() updates the parameters that have one.
  Step graphed_step(uint64_t data_seed, WeightCastPlan* plan) {
    const data::Batch batch = graphed_->stage(
        {random_tokens(data_seed).to(device_), random_tokens(data_seed + 1).to(device_)});
    Step s;
    emu::WorkLog log;
    const train_gpt::GraphedStep::Outputs out = graphed_->run(
        [&] {
          optimizer_->zero_grad();  // the warm-up step's: the captured backward writes anew
          std::unique_ptr<AutocastGuard> autocast;
          std::unique_ptr<WeightCastScope> weights;
          if (bf16_mixed_) {
            autocast = std::make_unique<AutocastGuard>(DType::BF16);
            weights = std::make_unique<WeightCastScope>(model_->parameters(), plan);
          }
          Tensor loss;
          {
            LossGradientScope loss_gradient(1.0);
            loss = model_->loss(batch.tokens, batch.targets);
          }
          loss.backward();
          weights.reset();
          const optim::DeviceClip clip = optim::clip_grad_norm_on_device(model_->parameters(), 1.0);
          optimizer_->set_grad_scale(clip.factor);
          optimizer_->step();
          return train_gpt::GraphedStep::Outputs{loss, clip.total_norm};
        },
        [&] { optimizer_->prepare_replay(); });
    s.loss = out.loss.item();
    s.grad_norm = out.grad_norm.item();
    s.step_launches = log.launches();
    s.step_host_launches = log.host_launches();
    return s;
  }

  std::unique_ptr<nn::CausalLM> model_;
  bool bf16_mixed_;
  Device device_;
  std::unique_ptr<optim::AdamW> optimizer_;
  WeightCastPlan plan_;  // as train_gpt keeps one
  std::unique_ptr<train_gpt::GraphedStep> graphed_;
};

// Four steps from the same weights and data on the CPU and on the emulated device: the losses
// and gradient norms agree to the kernels' summation orders (f32: the stand-in sums each
// product in order, the CPU's GEMM in blocks) and, under bf16-mixed, to bf16's rounding of
// the values those orders move across a rounding boundary. Measured 2026-12-06 (after the
// CUDA attention took grouped heads and GPT-2's GELU went into its GEMM's epilogue),
// relative: f32 losses equal, norms within 2.8e-8 (GPT-2) and 1.8e-8 (Llama); bf16-mixed
// losses within 3.2e-5 and 7.6e-6, norms 7.8e-4 and 2.5e-4.
void expect_the_cpu_s_training(ModelMaker make, bool bf16_mixed, double tolerance) {
  Trainer cpu(make, 2, Device::cpu(), bf16_mixed), cuda(make, 2, Device::cuda(0), bf16_mixed);
  for (uint64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Step want = cpu.step(10 * step), got = cuda.step(10 * step);
    EXPECT_TRUE(std::isfinite(got.loss));
    EXPECT_NEAR(got.loss, want.loss, tolerance * std::abs(want.loss));
    EXPECT_NEAR(got.grad_norm, want.grad_norm, tolerance * std::abs(want.grad_norm));
  }
}

TEST(CudaTraining, F32Gpt2StepsOnTheCudaPathFollowTheCpu) {
  expect_the_cpu_s_training(tiny_gpt, false, 1e-6);
}

TEST(CudaTraining, Bf16MixedGpt2StepsOnTheCudaPathFollowTheCpu) {
  expect_the_cpu_s_training(tiny_gpt, true, 2e-3);
}

TEST(CudaTraining, F32LlamaStepsOnTheCudaPathFollowTheCpu) {
  expect_the_cpu_s_training(tiny_llama, false, 1e-6);
}

TEST(CudaTraining, Bf16MixedLlamaStepsOnTheCudaPathFollowTheCpu) {
  expect_the_cpu_s_training(tiny_llama, true, 2e-3);
}

// The second step of a model of `layers` blocks (the first builds the matmul plans and the
// optimizer's state).
Step steady_bf16_step(int layers, ModelMaker make = tiny_gpt, Device device = Device::cuda(0)) {
  Trainer trainer(make, layers, device, /*bf16_mixed=*/true);
  trainer.step(1);
  return trainer.step(2);
}

// Per layer, forward and backward: 12 matmuls (4 products forward, the MLP's first with GELU
// in its epilogue; each one's two gradients backward, the weight's written in f32 by the GEMM,
// Note [Weight gradients in f32], with the bias's gradient from the same GEMM's epilogue, and
// GELU's gradient in the epilogue of the MLP's second product's input gradient: Note [GELU's
// gradient in the next product]); no cast: each block's first norm takes over the block before's
// last residual add backward, writing the MLP branch's 16-bit gradient in its own pass (Note [A
// norm takes over the residual add before it]), and the final norm the last block's. The parameters
// are cast once for the step, all of them in one launch (the WeightCastPlan kept from the step
// before), and their gradients never. Issue 46's budgets, met: at most 25 launches per layer
// (23: 39 with 8 gradients widened, 31 with 4 bias gradients summed apart, 28 with 1, 27 with
// the residual add's backward and its cast, 25 with GELU's forward a kernel of its own, 24
// with its backward), weights cast once per step, no activation cast. Held as a ceiling. No
// copy either: attention reads q, k and v in the fused projection and writes their gradients
// into one (Note [Attention on the packed projection]; 3 copies, a concat's, before 2026-12-07).
TEST(CudaTraining, ABf16MixedLayerTakes23LaunchesAndCastsNoActivation) {
  const Step one = steady_bf16_step(1), two = steady_bf16_step(2);
  EXPECT_EQ(two.matmuls - one.matmuls, 12u);
  EXPECT_EQ(two.copies, one.copies);
  EXPECT_EQ(two.cached_weights - one.cached_weights, 8u);
  // The whole step: every weight cast in one launch, nothing else cast.
  for (const Step& step : {one, two}) {
    EXPECT_EQ(step.batched_casts, 1u);
    EXPECT_EQ(step.casts, 0u);
  }
  EXPECT_LE(two.forward_backward_launches - one.forward_backward_launches, 23u);  // budget: 25
}

// GPT-2's tied table: the output projection's weight gradient (written in f32 by its GEMM)
// reaches the table first, and the embedding's backward adds its rows into it (Note [Adding
// into the partial gradient]), where it used to fill a table of zeros, scatter into it and
// leave the pass to add the two tables.
TEST(CudaTraining, TheEmbeddingAddsIntoTheTiedProjectionsGradient) {
  const Step step = steady_bf16_step(1);
  const size_t table = kVocab * 32 * sizeof(float);  // tiny_gpt's [vocab, 32] in f32
  for (const emu::Work& w : step.forward_backward) {
    EXPECT_FALSE(w.name.starts_with("fill_kernel") && w.argument_bytes == table)
        << "a table of zeros for the embedding's gradient";
    EXPECT_FALSE(w.name.starts_with("map_kernel") && w.argument_bytes == 3 * table)
        << "the two gradients of the tied table added";
  }
  EXPECT_EQ(count_named(step.forward_backward, "add_runs_kernel"), 2u);  // wte's and wpe's
}

// A Llama layer: 21 matmuls (7 products); no cast (the rotary tables are read in f32 by
// rotary_embedding, the weights cast with the step's others in one launch, their gradients
// written in f32 by the GEMMs, the residual add's backward taken over by the next norm); no
// copy (attention reads the grouped key/value heads as they are); 41 launches in all (48 with
// the grouped heads repeated and their gradients summed apart, 50 with that add's backward,
// 57 with the 7 weight gradients widened, 90 before rotary_embedding, 63 before swiglu, 60
// before rotary kept q's and k's layout, all 2026-12-06). Held as a ceiling.
TEST(CudaTraining, ABf16MixedLlamaLayerTakes41Launches) {
  const Step one = steady_bf16_step(1, tiny_llama), two = steady_bf16_step(2, tiny_llama);
  EXPECT_EQ(two.matmuls - one.matmuls, 21u);
  EXPECT_EQ(two.copies, one.copies);
  EXPECT_EQ(two.cached_weights - one.cached_weights, 7u);
  EXPECT_EQ(two.casts, 0u);
  EXPECT_EQ(two.batched_casts, 1u);
  EXPECT_LE(two.forward_backward_launches - one.forward_backward_launches, 41u);
}

// A linear layer's operands on `device`, uniform in [-1, 1) from `seed`: x [rows, 24],
// weight [24, 40] and bias [40], all needing gradients, and an output gradient g [rows, 40].
struct LinearOperands {
  Tensor x, w, b, g;
};
LinearOperands linear_operands(Device device, int64_t rows, uint64_t seed) {
  Generator gen(seed);
  LinearOperands o{Tensor::empty({rows, 24}), Tensor::empty({24, 40}), Tensor::empty({40}),
                   Tensor::empty({rows, 40})};
  for (Tensor* t : {&o.x, &o.w, &o.b, &o.g})
    uniform_(*t, -1.0, 1.0, gen);
  for (Tensor* t : {&o.x, &o.w, &o.b})
    *t = t->to(device).set_requires_grad(true);
  o.g = o.g.to(device);
  return o;
}

// Every element of `got` within tolerance * (1 + |want|) of `want`'s.
void expect_near_each(const std::vector<float>& got, const std::vector<float>& want,
                      double tolerance, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tolerance * (1 + std::abs(want[i]))) << what << "[" << i << "]";
}

// Note [The loss's gradient with the loss]: inside a LossGradientScope, logits handed over
// from their product get their gradient in cross_entropy's forward, with the loss and
// gradients of the two passes to the bit; a loss whose gradient is not the announced one gets
// its gradient rescaled (rounded once more); logits the caller still holds (passed as they
// are, or moved with another handle kept) keep their values, and the two passes run.
TEST(CudaTraining, CrossEntropyWritesItsGradientInItsForwardWhenTheLossGradientIsKnown) {
  const LinearOperands o = linear_operands(Device::cuda(0), 12, 21);
  std::vector<int64_t> picks(12);
  for (size_t i = 0; i < picks.size(); ++i)
    picks[i] = static_cast<int64_t>((7 * i + 3) % 40);
  const Tensor targets = Tensor::from_vector(picks, {12}).to(Device::cuda(0));
  enum class Logits { HandedOver, Held, MovedWithACopyKept };
  struct Run {
    float loss;
    std::vector<float> dx, dw;
    size_t fused, backward;  // launches of the one-pass kernel and of the backward's
  };
  auto run = [&](std::optional<double> announced, double scale, Logits logits) {
    o.x.set_grad(Tensor());
    o.w.set_grad(Tensor());
    emu::WorkLog log;
    Tensor loss;
    {
      std::optional<LossGradientScope> scope;
      if (announced) scope.emplace(*announced);
      if (logits == Logits::HandedOver) {
        loss = cross_entropy(matmul(o.x, o.w), targets);
      } else {
        Tensor held = matmul(o.x, o.w);
        const Tensor copy = held;
        const std::vector<float> before = held.to(Device::cpu()).to_vector<float>();
        loss = logits == Logits::Held ? cross_entropy(held, targets)
                                      : cross_entropy(std::move(held), targets);
        EXPECT_EQ(copy.to(Device::cpu()).to_vector<float>(), before) << "the caller's logits";
      }
    }
    (scale != 1.0 ? mul(loss, scale) : loss).backward();
    return Run{static_cast<float>(loss.item()), o.x.grad().to(Device::cpu()).to_vector<float>(),
               o.w.grad().to(Device::cpu()).to_vector<float>(),
               count_named(log.entries(), "cross_entropy_forward_backward_kernel"),
               count_named(log.entries(), "cross_entropy_backward_kernel")};
  };
  const Run plain = run(std::nullopt, 0.75, Logits::HandedOver);
  EXPECT_EQ(plain.fused, 0u);
  EXPECT_EQ(plain.backward, 1u);
  for (const Logits logits : {Logits::HandedOver, Logits::Held, Logits::MovedWithACopyKept}) {
    SCOPED_TRACE("logits case " + std::to_string(static_cast<int>(logits)));
    const bool one_pass = logits == Logits::HandedOver;
    const Run kept = run(0.75, 0.75, logits);
    EXPECT_EQ(kept.fused, one_pass ? 1u : 0u);
    EXPECT_EQ(kept.backward, one_pass ? 0u : 1u);
    EXPECT_EQ(kept.loss, plain.loss);
    EXPECT_EQ(kept.dx, plain.dx);
    EXPECT_EQ(kept.dw, plain.dw);
  }
  const Run broken = run(1.0, 0.75, Logits::HandedOver);  // the word not kept: rescaled
  EXPECT_EQ(broken.fused, 1u);
  EXPECT_EQ(broken.loss, plain.loss);
  expect_near_each(broken.dx, plain.dx, 1e-6, "dx");
  expect_near_each(broken.dw, plain.dw, 1e-6, "dw");
}

// A linear layer's backward on the CUDA path: the input's gradient one GEMM, the weight's and
// the bias's one more (the bias's by its BGRADA epilogue), in f32 and under bf16 autocast
// (whose weight and bias gradients come in f32), with the CPU's values to the summation order.
// Where cuBLASLt offers no algorithm with the epilogue, the sums are a second GEMM, ones[1, k]
// dY: a launch more, the same sums.
TEST(CudaTraining, ALinearsBiasGradientComesFromItsWeightGradientsGemm) {
  struct Run {
    std::vector<float> dx, dw, db;
    size_t matmuls = 0, launches = 0;
  };
  auto run = [](Device device, bool bf16, int64_t rows) {
    const auto [x, w, b, g] = linear_operands(device, rows, 3);
    Tensor y;
    {
      std::unique_ptr<AutocastGuard> autocast;
      if (bf16) autocast = std::make_unique<AutocastGuard>(DType::BF16);
      y = linear(x, w, b);
    }
    Run r;
    emu::WorkLog log;
    y.backward(cast(g, y.dtype()));
    r.matmuls = count_named(log.entries(), "cublasLtMatmul");
    r.launches = log.launches();
    r.dx = x.grad().to(Device::cpu()).to_vector<float>();
    r.dw = w.grad().to(Device::cpu()).to(DType::F32).to_vector<float>();
    r.db = b.grad().to(Device::cpu()).to(DType::F32).to_vector<float>();
    EXPECT_EQ(w.grad().dtype(), DType::F32);
    EXPECT_EQ(b.grad().dtype(), DType::F32);
    return r;
  };
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    const Run cpu = run(Device::cpu(), bf16, 33), cuda = run(Device::cuda(0), bf16, 33);
    EXPECT_EQ(cuda.matmuls, 2u);
    const double tolerance = bf16 ? 1e-2 : 1e-5;
    expect_near_each(cuda.dx, cpu.dx, tolerance, "dx");
    expect_near_each(cuda.dw, cpu.dw, tolerance, "dw");
    expect_near_each(cuda.db, cpu.db, tolerance, "db");
    // A shape not multiplied before, so that gemm.cpp asks the heuristic again.
    Run refused, offered = run(Device::cuda(0), bf16, 34);
    {
      emu::EpiloguesRefused no_epilogues;
      refused = run(Device::cuda(0), bf16, bf16 ? 35 : 36);
    }
    EXPECT_EQ(offered.matmuls, 2u);
    EXPECT_EQ(refused.matmuls, 3u);
    EXPECT_EQ(refused.launches, offered.launches + 1);
    const Run plain = run(Device::cpu(), bf16, bf16 ? 35 : 36);
    expect_near_each(refused.db, plain.db, tolerance, "db without the epilogue");
    expect_near_each(refused.dw, plain.dw, tolerance, "dw without the epilogue");
  }
}

// Issue 46 item 5's bytes: a bf16-mixed layer's launches (forward and backward, the second
// step) name the bytes the meta device charges the same layer, following the CUDA path
// (loom-sim's cost inputs): the products (A, B, C, D, the bias, GELU's input) to the byte,
// the weight casts to the byte, the whole layer within 6% (GPT-2: 5.1% measured 2026-12-07,
// 1.8% on 2026-12-06 when meta charged the concatenation of q, k and v's gradients; Llama:
// 4.8%). The rest is attention and the norms' backward: attention's two backward kernels each
// read the operands, which meta charges once, and each names the whole of GPT-2's packed
// gradient, of which it writes a third (dQ) or two (dK, dV); the norms' backward writes
// per-block partial sums of the parameters' gradients, which meta does not count.
void expect_a_layer_names_the_bytes_meta_charges(ModelMaker make, double tolerance) {
  const Step one = steady_bf16_step(1, make), two = steady_bf16_step(2, make);
  const Step meta_one = steady_bf16_step(1, make, Device::meta()),
             meta_two = steady_bf16_step(2, make, Device::meta());
  for (const auto& [cuda, meta] : {std::pair{&one, &meta_one}, std::pair{&two, &meta_two}}) {
    EXPECT_GT(cuda->bytes.products, 0.0);
    EXPECT_EQ(cuda->bytes.products, meta->bytes.products);
    EXPECT_GT(cuda->bytes.weight_casts, 0.0);
    EXPECT_EQ(cuda->bytes.weight_casts, meta->bytes.weight_casts);
  }
  const double layer = two.bytes.all - one.bytes.all;
  const double meta_layer = meta_two.bytes.all - meta_one.bytes.all;
  EXPECT_GT(meta_layer, 0.0);
  EXPECT_NEAR(layer, meta_layer, tolerance * meta_layer);
}

TEST(CudaTraining, ABf16MixedGpt2LayerNamesTheBytesMetaCharges) {
  expect_a_layer_names_the_bytes_meta_charges(tiny_gpt, 0.06);
}

TEST(CudaTraining, ABf16MixedLlamaLayerNamesTheBytesMetaCharges) {
  expect_a_layer_names_the_bytes_meta_charges(tiny_llama, 0.06);
}

// linear_gelu on the CUDA path (GPT-2's MLP's first layer): forward one GEMM, whose epilogue
// adds the bias, takes GELU and keeps the biased product for the backward (cuBLASLt's
// GELU_AUX_BIAS); the gradients GELU's, then linear's (two GEMMs, the bias's by BGRADA). Near
// the CPU's bias_gelu(matmul) to rounding; where cuBLASLt offers no epilogue the product goes
// to GELU's input and a GELU kernel reads it: then the bits of gelu(linear), a launch more.
TEST(CudaTraining, ALinearGelusGeluComesFromItsGemm) {
  struct Run {
    std::vector<float> y, dx, dw, db;
    size_t forward_matmuls = 0, forward_launches = 0, backward_matmuls = 0;
  };
  auto run = [](Device device, bool bf16, int64_t rows, bool composed = false) {
    const auto [x, w, b, g] = linear_operands(device, rows, 5);
    Run r;
    Tensor y;
    {
      std::unique_ptr<AutocastGuard> autocast;
      if (bf16) autocast = std::make_unique<AutocastGuard>(DType::BF16);
      emu::WorkLog log;
      y = composed ? gelu(linear(x, w, b)) : linear_gelu(x, w, b);
      r.forward_matmuls = count_named(log.entries(), "cublasLtMatmul");
      r.forward_launches = log.launches() - count_named(log.entries(), "convert");  // not casts
    }
    emu::WorkLog log;
    y.backward(cast(g, y.dtype()));
    r.backward_matmuls = count_named(log.entries(), "cublasLtMatmul");
    r.y = y.to(Device::cpu()).to(DType::F32).to_vector<float>();
    r.dx = x.grad().to(Device::cpu()).to(DType::F32).to_vector<float>();
    r.dw = w.grad().to(Device::cpu()).to(DType::F32).to_vector<float>();
    r.db = b.grad().to(Device::cpu()).to(DType::F32).to_vector<float>();
    return r;
  };
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    const Run cpu = run(Device::cpu(), bf16, 33), cuda = run(Device::cuda(0), bf16, 33);
    EXPECT_EQ(cuda.forward_matmuls, 1u);
    EXPECT_EQ(cuda.forward_launches, 1u);
    EXPECT_EQ(cuda.backward_matmuls, 2u);
    const double tolerance = bf16 ? 1e-2 : 1e-5;
    expect_near_each(cuda.y, cpu.y, tolerance, "y");
    expect_near_each(cuda.dx, cpu.dx, tolerance, "dx");
    expect_near_each(cuda.dw, cpu.dw, tolerance, "dw");
    expect_near_each(cuda.db, cpu.db, tolerance, "db");
    // A shape not multiplied before, so that gemm.cpp asks the heuristic again.
    const int64_t rows = bf16 ? 37 : 38;
    Run refused, composed;
    {
      emu::EpiloguesRefused no_epilogues;
      refused = run(Device::cuda(0), bf16, rows);
      composed = run(Device::cuda(0), bf16, rows, /*composed=*/true);
    }
    EXPECT_EQ(refused.forward_matmuls, 2u);  // the product, the rank-1 bias
    EXPECT_EQ(refused.forward_launches, 3u);  // and GELU
    EXPECT_EQ(refused.y, composed.y);
    EXPECT_EQ(refused.dx, composed.dx);
    EXPECT_EQ(refused.dw, composed.dw);
  }
}

// GPT-2's MLP, linear(gelu(linear(x))), as the model runs it (Note [GELU's gradient in the
// next product]): forward two GEMMs, GELU in the first's epilogue; backward four GEMMs and
// nothing else, GELU's gradient in the epilogue of the second layer's input-gradient GEMM
// (cuBLASLt's DGELU). Near the CPU's and the composed ops' values (GELU's gradient scales the
// unrounded product there); the same bits with an identity node between the two layers (a
// sharded unit's backward entry wraps the first layer's output), which is what keeps every
// strategy's arithmetic one. Where cuBLASLt offers no epilogue, the composed ops' bits, with
// GELU's kernels each way.
TEST(CudaTraining, AnMlpTakesGelusGradientInItsSecondGemm) {
  struct Run {
    std::vector<float> y, dx, dw1, db1, dw2, db2;
    size_t forward_launches = 0, backward_matmuls = 0, backward_launches = 0;
  };
  enum class Form { kFused, kWrapped, kComposed };
  auto run = [](Device device, bool bf16, int64_t rows, Form form = Form::kFused) {
    const auto [x, w1, b1, g1] = linear_operands(device, rows, 7);
    Generator gen(8);
    Tensor w2 = Tensor::empty({40, 24}), b2 = Tensor::empty({24}), g = Tensor::empty({rows, 24});
    for (Tensor* t : {&w2, &b2, &g})
      uniform_(*t, -1.0, 1.0, gen);
    w2 = w2.to(device).set_requires_grad(true);
    b2 = b2.to(device).set_requires_grad(true);
    g = g.to(device);
    Run r;
    Tensor y;
    {
      std::unique_ptr<AutocastGuard> autocast;
      if (bf16) autocast = std::make_unique<AutocastGuard>(DType::BF16);
      emu::WorkLog log;
      if (form == Form::kComposed) {
        y = linear(linear_gelu(x, w1, b1), w2, b2);
      } else {
        GeluOutput h = linear_gelu_keeping_input(x, w1, b1);
        if (form == Form::kWrapped && h.input.defined()) {
          const autograd::CustomOp entry{
              .name = "unit_entry",
              .forward = [](autograd::Context&,
                            const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
              .backward =
                  [](autograd::Context&, const std::vector<Tensor>& grad) {
                    return std::vector<Tensor>{grad[0]};
                  }};
          h.input = autograd::apply(entry, {h.input})[0];
        }
        y = linear_after_gelu(h, w2, b2);
      }
      r.forward_launches = log.launches() - count_named(log.entries(), "convert");  // not casts
    }
    {
      emu::WorkLog log;
      y.backward(cast(g, y.dtype()));
      r.backward_matmuls = count_named(log.entries(), "cublasLtMatmul");
      r.backward_launches = log.launches() - count_named(log.entries(), "convert");
    }
    const auto values = [](const Tensor& t) {
      return t.to(Device::cpu()).to(DType::F32).to_vector<float>();
    };
    r.y = values(y);
    r.dx = values(x.grad());
    r.dw1 = values(w1.grad());
    r.db1 = values(b1.grad());
    r.dw2 = values(w2.grad());
    r.db2 = values(b2.grad());
    return r;
  };
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    const Run cpu = run(Device::cpu(), bf16, 33), cuda = run(Device::cuda(0), bf16, 33);
    EXPECT_EQ(cuda.forward_launches, 2u);
    EXPECT_EQ(cuda.backward_matmuls, 4u);
    EXPECT_EQ(cuda.backward_launches, 4u);  // no GELU kernel
    // bf16: a bf16 ulp apart on many hidden values (the CPU rounds the first product before its
    // bias and GELU, Note [Bias and GELU in one pass]; the composed ops on CUDA round the
    // product GELU's gradient scales), 24 to 40 of which reach each result. A GELU's gradient
    // left out or taken at the wrong input is off by ~1.
    const double tolerance = bf16 ? 5e-2 : 1e-5;
    const Run cuda_composed = run(Device::cuda(0), bf16, 33, Form::kComposed);
    for (const Run* want : {&cpu, &cuda_composed}) {
      const Run& reference = *want;
      expect_near_each(cuda.y, reference.y, tolerance, "y");
      expect_near_each(cuda.dx, reference.dx, tolerance, "dx");
      expect_near_each(cuda.dw1, reference.dw1, tolerance, "dw1");
      expect_near_each(cuda.db1, reference.db1, tolerance, "db1");
      expect_near_each(cuda.dw2, reference.dw2, tolerance, "dw2");
      expect_near_each(cuda.db2, reference.db2, tolerance, "db2");
    }
    const Run wrapped = run(Device::cuda(0), bf16, 33, Form::kWrapped);
    for (const auto& [got, want] : {std::pair{&wrapped.dx, &cuda.dx},
                                    {&wrapped.dw1, &cuda.dw1},
                                    {&wrapped.db1, &cuda.db1},
                                    {&wrapped.dw2, &cuda.dw2}})
      EXPECT_EQ(*got, *want);
    // A shape not multiplied before, so that gemm.cpp asks the heuristic again.
    const int64_t rows = bf16 ? 35 : 36;
    Run refused, composed;
    {
      emu::EpiloguesRefused no_epilogues;
      refused = run(Device::cuda(0), bf16, rows);
      composed = run(Device::cuda(0), bf16, rows, Form::kComposed);
    }
    EXPECT_EQ(refused.backward_launches, 7u);  // GELU's gradient, and the rank-1 bias sums
    EXPECT_EQ(refused.y, composed.y);
    EXPECT_EQ(refused.dx, composed.dx);
    EXPECT_EQ(refused.dw1, composed.dw1);
    EXPECT_EQ(refused.db1, composed.db1);
    EXPECT_EQ(refused.dw2, composed.dw2);
    EXPECT_EQ(refused.db2, composed.db2);
  }
}

// The first step casts each weight at its first use, the next ones all at once: the same bits.
TEST(CudaTraining, CastingAStepsWeightsTogetherKeepsTheBits) {
  Trainer batched(tiny_gpt, 2, Device::cuda(0), true), alone(tiny_gpt, 2, Device::cuda(0), true);
  for (uint64_t step = 0; step < 3; ++step) {
    const Step a = batched.step(step), b = alone.step_without_a_plan(step);
    EXPECT_EQ(a.loss, b.loss) << "step " << step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    EXPECT_EQ(a.batched_casts, step == 0 ? 0u : 1u);
    EXPECT_EQ(b.batched_casts, 0u);
  }
}

// GPT-2 small's 148 parameter tensors (12 layers; narrow, so that the emulation is quick):
// the gradient norm (one pass over every gradient, one to finish the per-tensor sums), the
// clipping and AdamW, one launch each, within issue 46's budget of 5 for the optimizer step.
TEST(CudaTraining, TheOptimizerStepOfGpt2SmallsTensorsTakesFourLaunches) {
  const Step step = steady_bf16_step(12);
  EXPECT_EQ(step.optimizer_launches, 4u);  // issue 46's budget: 5
}

// Tensor::pin_memory: page-locked CPU memory, which a copy to or from the device takes in one
// cudaMemcpyAsync, where pageable memory goes through the 4 MiB staging buffers (three copies
// for these 12 MiB); pinned across a release and a new materialisation of its storage. A copy
// into pinned memory has finished when copy_ returns, as one into pageable memory has: the
// stream it ran on is synchronised after it (on a GPU the host would otherwise read the
// destination while the copy engine writes it).
TEST(CudaTraining, PinnedTensorsCopyWithoutStaging) {
  std::vector<float> values(3 << 20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) * 0.5f;
  const Tensor pageable = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  const Tensor pinned = pageable.pin_memory();
  EXPECT_TRUE(pinned.is_pinned());
  EXPECT_FALSE(pageable.is_pinned());
  EXPECT_TRUE(pinned.pin_memory().is_same(pinned));
  EXPECT_EQ(pinned.to_vector<float>(), values);
  auto memory_type = [](const Tensor& t) {
    cudaPointerAttributes attributes{};
    EXPECT_EQ(cudaPointerGetAttributes(&attributes, t.raw_data()), cudaSuccess);
    return attributes.type;
  };
  EXPECT_EQ(memory_type(pinned), cudaMemoryTypeHost);
  auto copies = [](const emu::WorkLog& log) { return count_named(log.entries(), "cudaMemcpy"); };
  emu::WorkLog log;
  const Tensor on_device = pinned.to(Device::cuda(0));
  EXPECT_EQ(copies(log), 1u);
  log.clear();
  const Tensor staged = pageable.to(Device::cuda(0));
  EXPECT_EQ(copies(log), 3u);
  Tensor back = Tensor::zeros({static_cast<int64_t>(values.size())}).pin_memory();
  log.clear();
  copy_(back, on_device);
  // Landed when copy_ returns (a download into pinned memory lands late on the emulated device
  // too: Note [Copies to and from pinned memory land late]), because copy_ waited for it.
  EXPECT_EQ(back.to_vector<float>(), values);
  EXPECT_EQ(copies(log), 1u);
  const std::vector<emu::Work> download = log.entries();
  ASSERT_EQ(download.size(), 2u);
  EXPECT_EQ(download[0].name, "cudaMemcpyAsync device to host");
  EXPECT_EQ(download[1].name, "cudaStreamSynchronize");
  EXPECT_EQ(download[1].stream, download[0].stream);
  back.storage()->release();
  back.storage()->materialize();
  EXPECT_TRUE(back.is_pinned());
  EXPECT_EQ(memory_type(back), cudaMemoryTypeHost);
  EXPECT_THROW(on_device.pin_memory(), Error);
}

// --cuda-graph (tools/train_gpt/graphed_step.h): the first step eager, the second captured and
// replayed, the later ones replayed, each the whole step (clipping on the device, AdamW
// reading its scalars from device memory). Every step's loss and gradient norm, and the
// weights after the last, are those of eager steps, bit for bit; from the second step on the
// host launches the step as one graph, which runs the eager step's forward and backward
// kernels and 4 for the optimizer (the two passes of the gradient norm, the clipping factor
// and AdamW; the eager step has the same 4 where it clips, 3 where it does not).
void expect_graphed_steps_keep_the_bits(ModelMaker make, bool bf16_mixed) {
  Trainer eager(make, 2, Device::cuda(0), bf16_mixed);
  Trainer graphed(make, 2, Device::cuda(0), bf16_mixed, /*cuda_graph=*/true);
  for (uint64_t step = 0; step < 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Step want = eager.step(10 * step), got = graphed.step(10 * step);
    EXPECT_EQ(got.loss, want.loss);
    EXPECT_EQ(got.grad_norm, want.grad_norm);
    if (step == 0) continue;
    EXPECT_EQ(got.step_host_launches, 1u);
    EXPECT_EQ(got.step_launches, want.forward_backward_launches + 4);
  }
  EXPECT_EQ(graphed.parameter_values(), eager.parameter_values());
}

TEST(CudaTraining, GraphedF32Gpt2StepsKeepTheBitsOfEagerSteps) {
  expect_graphed_steps_keep_the_bits(tiny_gpt, false);
}

TEST(CudaTraining, GraphedBf16MixedGpt2StepsKeepTheBitsOfEagerSteps) {
  expect_graphed_steps_keep_the_bits(tiny_gpt, true);
}

TEST(CudaTraining, GraphedBf16MixedLlamaStepsKeepTheBitsOfEagerSteps) {
  expect_graphed_steps_keep_the_bits(tiny_llama, true);
}

}  // namespace
}  // namespace loom
