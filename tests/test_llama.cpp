// The Llama model and its ops: RMS norm and SiLU against their closed forms, rotary positions
// (identity at position 0, attention scores that depend only on the distance), gradients
// against finite differences with grouped-query and multi-query attention, activation
// checkpointing bitwise. transformers' numbers: tests/strategies/test_torch_reference.cpp.

#include <gtest/gtest.h>

#include <cmath>

#include "causal_lm_checks.h"
#include "gradcheck.h"
#include "nn/llama.h"
#include "tensor/ops.h"

namespace loom::nn {
namespace {

LlamaConfig tiny_f64(int64_t kv_heads) {
  LlamaConfig c;
  c.vocab_size = 11;
  c.context = 6;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = kv_heads;
  c.hidden = 16;
  c.intermediate = 24;
  c.options.dtype = DType::F64;
  return c;
}


TEST(LlamaOps, RmsNormIsTheClosedForm) {
  // Row [3, 4]: mean of squares 12.5; with weight [1, 2]: [3, 8] / sqrt(12.5 + eps).
  const double eps = 1e-6;
  Tensor y = rms_norm(Tensor::from_vector<double>({3, 4, 0, 0}, {2, 2}),
                      Tensor::from_vector<double>({1, 2}, {2}), eps);
  const std::vector<double> got = y.to_vector<double>();
  EXPECT_DOUBLE_EQ(got[0], 3 / std::sqrt(12.5 + eps));
  EXPECT_DOUBLE_EQ(got[1], 8 / std::sqrt(12.5 + eps));
  EXPECT_EQ(got[2], 0.0);  // a zero row stays zero (eps keeps it finite)
  EXPECT_EQ(got[3], 0.0);
}

TEST(LlamaOps, SiluIsTheClosedForm) {
  const std::vector<double> x{-3, -0.5, 0, 0.5, 3};
  const std::vector<double> got = silu(Tensor::from_vector<double>(x, {5})).to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_DOUBLE_EQ(got[i], x[i] / (1 + std::exp(-x[i]))) << "x " << x[i];
}

// f32 SiLU runs on a polynomial exp (kernels/cpu/vec_math.h, relative error about 2e-7), so
// that its loops vectorise: value and gradient within 1e-6 relative of the closed form in
// f64 over [-100, 100]. Below -87 the clamped exp leaves silu a tiny negative number instead
// of a denormal one, which the 1e-30 absolute term accepts.
TEST(LlamaOps, SiluInF32IsTheClosedFormWithinItsTolerance) {
  std::vector<float> x;
  for (float v = -100.0f; v <= 100.0f; v += 0.37f)
    x.push_back(v);
  const auto n = static_cast<int64_t>(x.size());
  Tensor t = Tensor::from_vector<float>(x, {n}).set_requires_grad(true);
  Tensor y = silu(t);
  sum(y).backward();
  const std::vector<float> got = y.to_vector<float>(), slope = t.grad().to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], s = 1 / (1 + std::exp(-v));
    const double value = v * s, gradient = s * (1 + v * (1 - s));
    EXPECT_NEAR(got[i], value, 1e-6 * std::abs(value) + 1e-30) << "x " << v;
    EXPECT_NEAR(slope[i], gradient, 1e-6 * std::abs(gradient) + 1e-30) << "x " << v;
  }
}

TEST(LlamaOps, RotaryIsIdentityAtPositionZeroAndScoresDependOnDistanceOnly) {
  const int64_t time = 9, dim = 8;
  const RotaryTables tables = rotary_tables(time, dim, 10000.0, DType::F64, Device::cpu());
  Generator gen(7);
  Tensor q = Tensor::empty({1, 1, 1, dim}, DType::F64), k = Tensor::empty({1, 1, 1, dim}, DType::F64);
  normal_(q, 0, 1, gen);
  normal_(k, 0, 1, gen);
  // The same q and k at every position.
  Tensor qs = expand(q, {1, 1, time, dim}).contiguous(), ks = expand(k, {1, 1, time, dim}).contiguous();
  const std::vector<double> rq = apply_rotary(qs, tables).to_vector<double>(),
                            rk = apply_rotary(ks, tables).to_vector<double>(),
                            q0 = q.to_vector<double>();
  for (int64_t i = 0; i < dim; ++i)
    EXPECT_DOUBLE_EQ(rq[i], q0[i]) << "position 0 is not rotated";
  auto score = [&](int64_t m, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < dim; ++i)
      s += rq[m * dim + i] * rk[n * dim + i];
    return s;
  };
  // The tables are f32 (as Hugging Face's): equal up to their rounding.
  EXPECT_NEAR(score(5, 2), score(3, 0), 1e-5);
  EXPECT_NEAR(score(8, 1), score(7, 0), 1e-5);
  EXPECT_GT(std::abs(score(5, 2) - score(5, 3)), 1e-3);  // and they do depend on the distance
}

// Hugging Face's apply_rotary_pos_emb as ops, the tables cast to x's dtype first.
Tensor rotary_as_ops(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const Tensor rotated = concat({neg(x.narrow(-1, half, half)), x.narrow(-1, 0, half)}, -1);
  return add(mul(x, cos.to(x.dtype())), mul(rotated, sin.to(x.dtype())));
}

// rotary_embedding on Llama's layout (a [batch, time, heads, dim] projection seen as [batch,
// heads, time, dim]): forward bitwise the ops' (each product and the sum rounded to x's dtype
// as they round them); backward within the ops' roundings (f32: 1e-6 relative; bf16, which the
// op rounds once where the ops round two products and their sum, each term of the size of dy,
// about 1 here: 1.6e-2 (|want| + 1), two units in the last place of such a term; one element
// 8.5e-4 apart at a gradient of 0.027 seen), and against finite differences in f64.
TEST(LlamaOps, RotaryEmbeddingIsTheOpsInOnePass) {
  const int64_t batch = 2, time = 5, heads = 3, dim = 8;
  const RotaryTables tables = rotary_tables(time, dim, 10000.0, DType::F32, Device::cpu());
  Generator gen(11);
  for (const DType dtype : {DType::F32, DType::BF16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor projection = Tensor::empty({batch, time, heads, dim}, DType::F32);
    normal_(projection, 0, 1, gen);
    Tensor leaf = projection.to(dtype);
    leaf.set_requires_grad(true);
    Tensor weights = Tensor::empty({batch, heads, time, dim}, DType::F32);
    normal_(weights, 0, 1, gen);
    weights = weights.to(dtype);
    Tensor grads[2], outputs[2];
    Shape x_strides;
    for (int fused = 0; fused < 2; ++fused) {
      leaf.set_grad(Tensor());
      const Tensor x = leaf.permute({0, 2, 1, 3});
      x_strides = x.strides();
      outputs[fused] = fused ? rotary_embedding(x, tables.cos, tables.sin)
                             : rotary_as_ops(x, tables.cos, tables.sin);
      sum(mul(outputs[fused], weights)).backward();
      grads[fused] = leaf.grad().to(DType::F64);
    }
    EXPECT_EQ(outputs[1].contiguous().to(DType::F64).to_vector<double>(),
              outputs[0].contiguous().to(DType::F64).to_vector<double>());
    EXPECT_EQ(outputs[1].strides(), x_strides) << "the result keeps x's layout";
    const std::vector<double> got = grads[1].to_vector<double>(),
                              want = grads[0].to_vector<double>();
    const double tolerance = dtype == DType::BF16 ? 1.6e-2 : 1e-6;
    for (size_t i = 0; i < got.size(); ++i) {
      const double scale = std::abs(want[i]) + (dtype == DType::BF16 ? 1 : 1e-3);
      ASSERT_NEAR(got[i], want[i], tolerance * scale) << "element " << i;
    }
  }
  Generator leaves(5);
  const Tensor x = loom::testing::random_leaf({1, 2, time, dim}, leaves);
  const RotaryTables f64 = rotary_tables(time, dim, 10000.0, DType::F64, Device::cpu());
  loom::testing::expect_gradients_match(
      [&](const std::vector<Tensor>& in) { return rotary_embedding(in[0], f64.cos, f64.sin); },
      {x});
}

TEST(LlamaOps, RotaryEmbeddingRefusesWhatItCannotRotate) {
  const RotaryTables tables = rotary_tables(4, 6, 10000.0, DType::F32, Device::cpu());
  const Tensor x = Tensor::zeros({1, 2, 4, 6});
  EXPECT_THROW(rotary_embedding(Tensor::zeros({2, 4, 6}), tables.cos, tables.sin), Error);
  EXPECT_THROW(rotary_embedding(Tensor::zeros({1, 2, 4, 5}), tables.cos, tables.sin), Error);
  EXPECT_THROW(rotary_embedding(x, tables.cos.narrow(0, 0, 3), tables.sin), Error);
  EXPECT_THROW(rotary_embedding(x, tables.cos.to(DType::F16), tables.sin.to(DType::F16)), Error);
  Tensor learned = tables.cos.clone();
  learned.set_requires_grad(true);
  EXPECT_THROW(rotary_embedding(x, learned, tables.sin), Error);
}

// swiglu against silu and mul: the forward's bits (f32, bf16: silu rounded before the
// product, as the ops round it), up's gradient's bits, gate's within a rounding (the ops round
// dy * up before silu's backward: f32 1e-6, bf16 8e-3 relative to |dy up| + |want|), and
// finite differences in f64.
TEST(LlamaOps, SwigluIsSiluTimesUpInOnePass) {
  Generator gen(13);
  for (const DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor leaves[2];
    for (Tensor& t : leaves) {
      Tensor values = Tensor::empty({4, 6}, DType::F32);
      normal_(values, 0, 3, gen);
      t = values.to(dtype);
      t.set_requires_grad(true);
    }
    Tensor weights = Tensor::empty({4, 6}, DType::F32);
    normal_(weights, 0, 1, gen);
    weights = weights.to(dtype);
    std::vector<double> outputs[2], gate_grads[2], up_grads[2];
    for (int fused = 0; fused < 2; ++fused) {
      for (Tensor& t : leaves) t.set_grad(Tensor());
      const Tensor y = fused ? swiglu(leaves[0], leaves[1]) : mul(silu(leaves[0]), leaves[1]);
      sum(mul(y, weights)).backward();
      outputs[fused] = y.to(DType::F64).to_vector<double>();
      gate_grads[fused] = leaves[0].grad().to(DType::F64).to_vector<double>();
      up_grads[fused] = leaves[1].grad().to(DType::F64).to_vector<double>();
    }
    EXPECT_EQ(outputs[1], outputs[0]);
    EXPECT_EQ(up_grads[1], up_grads[0]);
    const std::vector<double> up = leaves[1].to(DType::F64).to_vector<double>(),
                              w = weights.to(DType::F64).to_vector<double>();
    const double tolerance = dtype == DType::BF16 ? 8e-3 : 1e-6;
    for (size_t i = 0; i < up.size(); ++i) {
      const double scale = std::abs(w[i] * up[i]) + std::abs(gate_grads[0][i]);
      EXPECT_NEAR(gate_grads[1][i], gate_grads[0][i], tolerance * scale) << "element " << i;
    }
  }
  Generator leaves(9);
  const Tensor gate = loom::testing::random_leaf({3, 4}, leaves);
  const Tensor up = loom::testing::random_leaf({3, 4}, leaves);
  loom::testing::expect_gradients_match(
      [](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }, {gate, up});
  EXPECT_THROW(swiglu(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})), Error);
  EXPECT_THROW(swiglu(Tensor::zeros({2, 3}), Tensor::zeros({2, 3}, DType::F64)), Error);
}

void expect_gradients_match_finite_differences(const LlamaConfig& config) {
  Llama model(config, 3);
  testing::expect_gradients_match_finite_differences(model, /*stride=*/3);  // a quick sample
}

TEST(Llama, GroupedQueryAttentionGradientsMatchFiniteDifferences) {
  expect_gradients_match_finite_differences(tiny_f64(2));
}

TEST(Llama, MultiQueryAttentionWithTiedEmbeddingsGradientsMatchFiniteDifferences) {
  LlamaConfig c = tiny_f64(1);
  c.tie_embeddings = true;
  expect_gradients_match_finite_differences(c);
}

TEST(Llama, HasHuggingFaceNamesAndShapes) {
  Llama model(tiny_f64(2), 0);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : model.named_parameters())
    shapes[name] = p.shape();
  EXPECT_EQ(shapes.size(), 2u + 2u * 9u + 1u);  // embed, norm, lm_head; 9 per layer
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (Shape{11, 16}));
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.q_proj.weight"), (Shape{16, 16}));
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.k_proj.weight"), (Shape{8, 16}));  // 2 x 4
  EXPECT_EQ(shapes.at("model.layers.1.self_attn.o_proj.weight"), (Shape{16, 16}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (Shape{24, 16}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.down_proj.weight"), (Shape{16, 24}));
  EXPECT_EQ(shapes.at("model.layers.0.post_attention_layernorm.weight"), (Shape{16}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (Shape{11, 16}));
}

// In f32 and under bf16 and f16 autocast: PyTorch's checkpoint replays the forward under the
// autocast state it ran in, and so does Loom's (the backward that recomputes runs outside it).
TEST(Llama, ActivationCheckpointingGivesBitwiseEqualGradients) {
  for (DType autocast : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(autocast));
    LlamaConfig c = tiny_f64(2);
    c.options.dtype = DType::F32;
    Llama plain(c, 5);
    c.checkpoint_activations = true;
    Llama recomputed(c, 5);
    testing::expect_checkpointing_bitwise(plain, recomputed, autocast);
  }
}

TEST(Llama, RefusesInconsistentConfigs) {
  LlamaConfig c = tiny_f64(3);  // 3 does not divide 4 heads
  EXPECT_THROW(
      {
        try {
          Llama model(c, 0);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("num_key_value_heads (3) must divide"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
  Llama model(tiny_f64(2), 0);
  EXPECT_THROW(model.forward(Tensor::zeros({1, 7}, DType::I64)), Error);  // past the context
}

}  // namespace
}  // namespace loom::nn
