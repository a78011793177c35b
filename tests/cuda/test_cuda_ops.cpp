// Every op on CUDA against the same op on the CPU: forward values and the gradients of every
// input, in f32 (tolerance 1e-4 relative to the largest magnitude, for differences in
// summation order and fused multiply-adds) and in bf16 (the CPU computes in f32 on the
// rounded inputs; tolerance 2e-2). Then the GPT end to end: loss and every parameter's
// gradient, and a few AdamW steps. Needs a GPU; skipped (by name) where there is none.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "nn/gpt.h"
#include "optim/adamw.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"
#include "tensor/random.h"
#include "tests/cuda/gpu_test_util.h"

namespace loom {
namespace {

using gpu_test::kGpu;
using gpu_test::random_tensor;

// max |a - b| / max(1, max |b|): one number per comparison, stable across magnitudes.
double scaled_error(const Tensor& got, const Tensor& want) {
  std::vector<double> a = got.to_vector<double>(), b = want.to_vector<double>();
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

using Op = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs `op` on CPU leaves and on their copies on the GPU (in `dtype` there), back-propagates
// sum(output * weights) on both, and compares output and input gradients.
void expect_matches_cpu(const char* name, const Op& op, const std::vector<Tensor>& inputs,
                        DType dtype = DType::F32, double tolerance = 1e-4) {
  SCOPED_TRACE(name);
  std::vector<Tensor> cpu, gpu;
  for (const Tensor& x : inputs) {
    Tensor host = dtype == DType::F32 ? x : x.to(dtype).to(DType::F32);  // same rounded values
    cpu.push_back(host.clone().set_requires_grad(true));
    gpu.push_back(x.to(dtype).to(kGpu).set_requires_grad(true));
  }
  Tensor want = op(cpu);
  Tensor got = op(gpu);
  ASSERT_TRUE(got.device().is_cuda());
  EXPECT_LT(scaled_error(got.to(Device::cpu()).to(DType::F32), want), tolerance) << "output";
  Tensor weights = random_tensor(want.shape(), 99);
  sum(mul(want, weights)).backward();
  sum(mul(got, weights.to(got.dtype()).to(kGpu))).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu[i].grad().defined()) continue;
    ASSERT_TRUE(gpu[i].grad().defined()) << "input " << i;
    EXPECT_LT(scaled_error(gpu[i].grad().to(Device::cpu()).to(DType::F32), cpu[i].grad()),
              tolerance)
        << "gradient of input " << i;
  }
}

TEST(CudaOps, ElementwiseWithBroadcasting) {
  SKIP_WITHOUT_GPU();
  Tensor a = random_tensor({4, 3, 5}, 1), b = random_tensor({3, 1}, 2);
  for (DType dtype : {DType::F32, DType::BF16}) {
    double tol = dtype == DType::F32 ? 1e-5 : 2e-2;
    expect_matches_cpu("add", [](auto& x) { return add(x[0], x[1]); }, {a, b}, dtype, tol);
    expect_matches_cpu("sub", [](auto& x) { return sub(x[0], x[1]); }, {a, b}, dtype, tol);
    expect_matches_cpu("mul", [](auto& x) { return mul(x[0], x[1]); }, {a, b}, dtype, tol);
    expect_matches_cpu("scalars", [](auto& x) { return add(mul(x[0], 3.0), 0.5); }, {a}, dtype,
                       tol);
    expect_matches_cpu("gelu", [](auto& x) { return gelu(x[0]); }, {a}, dtype, tol);
    expect_matches_cpu("bias_gelu", [](auto& x) { return bias_gelu(x[0], x[1]); },
                       {a, random_tensor({5}, 5)}, dtype, tol);
  }
  Tensor positive = add(mul(random_tensor({3, 1}, 3), 0.1), 2.0);
  expect_matches_cpu("div", [](auto& x) { return div(x[0], x[1]); }, {a, positive});
}

TEST(CudaOps, CopiesCastsAndViews) {
  SKIP_WITHOUT_GPU();
  Tensor a = random_tensor({4, 6, 5}, 4);
  expect_matches_cpu("permute+contiguous",
                     [](auto& x) { return x[0].permute({2, 0, 1}).contiguous(); }, {a});
  expect_matches_cpu("narrow+concat",
                     [](auto& x) {
                       return concat({x[0].narrow(1, 1, 3), x[0].narrow(1, 0, 2)}, 1);
                     },
                     {a});
  expect_matches_cpu("cast", [](auto& x) { return cast(cast(x[0], DType::BF16), DType::F32); },
                     {a}, DType::F32, 1e-2);
  // Exact round trips through every dtype that holds the values exactly.
  Tensor ints = Tensor::from_vector<int64_t>({-3, 0, 7, 1 << 20}, {4});
  EXPECT_EQ(ints.to(kGpu).to(DType::I32).to(Device::cpu()).to_vector<int64_t>(),
            ints.to_vector<int64_t>());
  Tensor filled = Tensor::full({3, 3}, 1.25, DType::BF16, kGpu);
  EXPECT_EQ(filled.to_vector<float>(), std::vector<float>(9, 1.25f));
}

TEST(CudaOps, Reductions) {
  SKIP_WITHOUT_GPU();
  Tensor a = random_tensor({6, 7, 9}, 5);
  expect_matches_cpu("sum", [](auto& x) { return sum(x[0]); }, {a});
  expect_matches_cpu("sum dims", [](auto& x) { return sum(x[0], {0, 2}); }, {a});
  expect_matches_cpu("mean keepdim", [](auto& x) { return mean(x[0], {1}, true); }, {a});
  expect_matches_cpu("max", [](auto& x) { return max(x[0], 1); }, {a});
}

TEST(CudaOps, MatmulAndLinear) {
  SKIP_WITHOUT_GPU();
  Tensor x = random_tensor({2, 5, 16}, 6), w = random_tensor({16, 12}, 7),
         bias = random_tensor({12}, 8), y = random_tensor({2, 16, 3}, 9);
  expect_matches_cpu("linear", [](auto& t) { return linear(t[0], t[1], t[2]); }, {x, w, bias});
  expect_matches_cpu("matmul batched", [](auto& t) { return matmul(t[0], t[1]); }, {x, y});
  expect_matches_cpu("matmul transposed",
                     [](auto& t) { return matmul(t[0], transpose(t[1], 0, 1)); },
                     {random_tensor({7, 16}, 10), random_tensor({9, 16}, 11)});
  expect_matches_cpu("linear bf16", [](auto& t) { return linear(t[0], t[1], t[2]); },
                     {x, w, bias}, DType::BF16, 2e-2);
  // GPT-2's MLP as the model runs it: GELU in the first GEMM's epilogue (GELU_AUX_BIAS), its
  // gradient in the second's input-gradient GEMM (DGELU), where cuBLASLt offers them; the
  // hidden width a multiple of 8, as their aux matrix needs. Checks cuBLASLt's GELU against
  // the CPU's tanh form each way.
  const auto mlp = [](auto& t) {
    return linear_after_gelu(linear_gelu_keeping_input(t[0], t[1], t[2]), t[3], t[4]);
  };
  const std::vector<Tensor> mlp_inputs{x, random_tensor({16, 24}, 12), random_tensor({24}, 13),
                                       random_tensor({24, 12}, 14), random_tensor({12}, 15)};
  expect_matches_cpu("mlp", mlp, mlp_inputs);
  expect_matches_cpu("mlp bf16", mlp, mlp_inputs, DType::BF16, 3e-2);
}

TEST(CudaOps, NormalisationSoftmaxAttentionLosses) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::F32, DType::BF16}) {
    double tol = dtype == DType::F32 ? 1e-4 : 3e-2;
    expect_matches_cpu("layer_norm",
                       [](auto& t) { return layer_norm(t[0], t[1], t[2]); },
                       {random_tensor({3, 4, 24}, 12), random_tensor({24}, 13),
                        random_tensor({24}, 14)},
                       dtype, tol);
    expect_matches_cpu("add_layer_norm",
                       [](auto& t) {
                         AddNorm out = add_layer_norm(t[0], t[1], t[2], t[3]);
                         return add(out.normed, mul(out.sum, 0.5));
                       },
                       {random_tensor({3, 4, 24}, 19), random_tensor({3, 4, 24}, 20),
                        random_tensor({24}, 13), random_tensor({24}, 14)},
                       dtype, tol);
    // The norm keeping the stream after an f32 stream plus a bf16 branch, which takes over
    // that add's backward: the stream and the normed output both read by the loss.
    expect_matches_cpu("layer_norm_keeping_stream",
                       [](auto& t) {
                         const AddNorm out = layer_norm_keeping_stream(
                             add(t[0], cast(t[1], DType::BF16)), t[2], t[3], 1e-5, DType::BF16);
                         return add(cast(out.normed, out.sum.dtype()), mul(out.sum, 0.5));
                       },
                       {random_tensor({3, 4, 24}, 21), random_tensor({3, 4, 24}, 22),
                        random_tensor({24}, 13), random_tensor({24}, 14)},
                       DType::F32, 3e-2);
    expect_matches_cpu("softmax causal", [](auto& t) { return softmax(t[0], true); },
                       {random_tensor({2, 7, 7}, 15)}, dtype, tol);
    expect_matches_cpu("causal_attention",
                       [](auto& t) { return causal_attention(t[0], t[1], t[2]); },
                       {random_tensor({2, 3, 13, 16}, 16), random_tensor({2, 3, 13, 16}, 17),
                        random_tensor({2, 3, 13, 16}, 18)},
                       dtype, tol);
  }
  Tensor targets = Tensor::from_vector<int64_t>({3, 0, 9, 9, 1, 4}, {6});
  expect_matches_cpu("cross_entropy",
                     [&](auto& t) { return cross_entropy(t[0], targets.to(t[0].device())); },
                     {random_tensor({6, 10}, 19)});
  // bf16 logits are read as they are; the loss is f32, as under PyTorch's autocast.
  expect_matches_cpu("cross_entropy of bf16 logits",
                     [&](auto& t) { return cross_entropy(t[0], targets.to(t[0].device())); },
                     {random_tensor({6, 10}, 19)}, DType::BF16, 3e-2);
  EXPECT_EQ(cross_entropy(random_tensor({6, 10}, 19).to(DType::BF16).to(kGpu), targets.to(kGpu))
                .dtype(),
            DType::F32);
  Tensor indices = Tensor::from_vector<int64_t>({2, 5, 2, 0, 2, 7}, {2, 3});
  expect_matches_cpu("embedding (repeated rows)",
                     [&](auto& t) { return embedding(indices.to(t[0].device()), t[0]); },
                     {random_tensor({8, 6}, 20)});
}

TEST(CudaOps, EmbeddingBackwardIsBitwiseReproducible) {
  SKIP_WITHOUT_GPU();
  Tensor indices = Tensor::from_vector<int64_t>(std::vector<int64_t>(512, 3), {512});
  std::vector<std::vector<float>> grads;
  for (int run = 0; run < 2; ++run) {
    Tensor w = random_tensor({8, 64}, 21).to(kGpu).set_requires_grad(true);
    sum(mul(embedding(indices.to(kGpu), w), random_tensor({512, 64}, 22).to(kGpu))).backward();
    grads.push_back(w.grad().to_vector<float>());
  }
  EXPECT_EQ(grads[0], grads[1]);
}

nn::GPTConfig small_gpt() {
  nn::GPTConfig c;
  c.vocab_size = 64;
  c.context = 16;
  c.layers = 2;
  c.heads = 2;
  c.embd = 32;
  return c;
}

TEST(CudaGpt, LossAndGradientsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  nn::GPT cpu_model(small_gpt(), 7), gpu_model(small_gpt(), 7);
  gpu_model.to(kGpu);
  Tensor tokens = Tensor::from_vector<int64_t>(std::vector<int64_t>(32, 5), {2, 16});
  Tensor targets = Tensor::from_vector<int64_t>(std::vector<int64_t>(32, 9), {2, 16});
  Tensor want = cpu_model.loss(tokens, targets);
  Tensor got = gpu_model.loss(tokens, targets);
  EXPECT_NEAR(got.item(), want.item(), 1e-4);
  want.backward();
  got.backward();
  auto cpu_params = cpu_model.named_parameters();
  auto gpu_params = gpu_model.named_parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_LT(scaled_error(gpu_params[i].second.grad(), cpu_params[i].second.grad()), 1e-4)
        << cpu_params[i].first;
  }
}

TEST(CudaGpt, AdamWStepsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  nn::GPT cpu_model(small_gpt(), 8), gpu_model(small_gpt(), 8);
  gpu_model.to(kGpu);
  optim::AdamW cpu_opt(cpu_model.parameters(), {.lr = 1e-2});
  optim::AdamW gpu_opt(gpu_model.parameters(), {.lr = 1e-2});
  Tensor tokens = Tensor::from_vector<int64_t>(std::vector<int64_t>(32, 3), {2, 16});
  for (int step = 0; step < 3; ++step) {
    cpu_model.loss(tokens, tokens).backward();
    gpu_model.loss(tokens, tokens).backward();
    cpu_opt.step();
    gpu_opt.step();
    cpu_opt.zero_grad();
    gpu_opt.zero_grad();
  }
  auto cpu_params = cpu_model.named_parameters();
  auto gpu_params = gpu_model.named_parameters();
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    EXPECT_LT(scaled_error(gpu_params[i].second, cpu_params[i].second), 1e-3)
        << cpu_params[i].first;
  }
}

TEST(CudaGpt, Bf16AutocastLossIsCloseToF32) {
  SKIP_WITHOUT_GPU();
  nn::GPT model(small_gpt(), 9);
  model.to(kGpu);
  Tensor tokens = Tensor::from_vector<int64_t>(std::vector<int64_t>(32, 1), {2, 16});
  double f32 = model.loss(tokens, tokens).item();
  AutocastGuard bf16(DType::BF16);
  EXPECT_NEAR(model.loss(tokens, tokens).item(), f32, 2e-2 * (1 + std::abs(f32)));
}

}  // namespace
}  // namespace loom
