// Every op's vector-Jacobian product against central finite differences in f64.

#include <gtest/gtest.h>

#include "gradcheck.h"
#include "tensor/autocast.h"
#include "tensor/ops/dispatch.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

namespace loom {
namespace {

using testing::expect_gradients_match;
using testing::random_leaf;
using Inputs = std::vector<Tensor>;

class OpGradient : public ::testing::Test {
 protected:
  Generator gen{42};
};

TEST_F(OpGradient, AddSubMulDivWithBroadcasting) {
  Tensor a = random_leaf({2, 3, 4}, gen), b = random_leaf({3, 1}, gen), c = random_leaf({4}, gen);
  expect_gradients_match([](const Inputs& x) { return add(x[0], x[1]); }, {a, b});
  expect_gradients_match([](const Inputs& x) { return sub(x[0], x[1]); }, {a, c});
  expect_gradients_match([](const Inputs& x) { return mul(x[1], x[0]); }, {a, b});
  Tensor positive = add(random_leaf({4}, gen, false), 3.0).detach().set_requires_grad(true);
  expect_gradients_match([](const Inputs& x) { return div(x[0], x[1]); }, {a, positive});
}

TEST_F(OpGradient, ScalarOpsAndNeg) {
  Tensor a = random_leaf({3, 5}, gen);
  expect_gradients_match([](const Inputs& x) { return add(x[0], 2.5); }, {a});
  expect_gradients_match([](const Inputs& x) { return mul(x[0], -1.5); }, {a});
  expect_gradients_match([](const Inputs& x) { return neg(x[0]); }, {a});
}

TEST_F(OpGradient, Gelu) {
  Tensor a = mul(random_leaf({4, 6}, gen, false), 3.0).detach().set_requires_grad(true);
  expect_gradients_match([](const Inputs& x) { return gelu(x[0]); }, {a});
}

TEST_F(OpGradient, Silu) {
  Tensor a = mul(random_leaf({4, 6}, gen, false), 3.0).detach().set_requires_grad(true);
  expect_gradients_match([](const Inputs& x) { return silu(x[0]); }, {a});
}

TEST_F(OpGradient, Matmul2D) {
  Tensor a = random_leaf({3, 4}, gen), b = random_leaf({4, 5}, gen);
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], x[1]); }, {a, b});
}

TEST_F(OpGradient, MatmulWithTransposedViews) {
  Tensor a = random_leaf({4, 3}, gen), b = random_leaf({5, 4}, gen);
  expect_gradients_match(
      [](const Inputs& x) { return matmul(transpose(x[0], 0, 1), transpose(x[1], 0, 1)); }, {a, b});
}

TEST_F(OpGradient, MatmulFoldsLeadingDims) {
  Tensor a = random_leaf({2, 3, 4}, gen), b = random_leaf({4, 5}, gen);
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], x[1]); }, {a, b});
}

TEST_F(OpGradient, BatchedMatmul) {
  Tensor a = random_leaf({2, 2, 3, 4}, gen), b = random_leaf({2, 2, 4, 3}, gen);
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], x[1]); }, {a, b});
  expect_gradients_match([](const Inputs& x) { return matmul(x[0], transpose(x[0], -1, -2)); },
                         {a});
}

TEST_F(OpGradient, Linear) {
  Tensor x = random_leaf({2, 3, 4}, gen), w = random_leaf({4, 6}, gen), b = random_leaf({6}, gen);
  expect_gradients_match([](const Inputs& in) { return linear(in[0], in[1], in[2]); }, {x, w, b});
}

TEST_F(OpGradient, LayerNorm) {
  Tensor x = random_leaf({3, 2, 8}, gen), w = random_leaf({8}, gen), b = random_leaf({8}, gen);
  expect_gradients_match([](const Inputs& in) { return layer_norm(in[0], in[1], in[2], 1e-5); },
                         {x, w, b});
}

TEST_F(OpGradient, BiasGelu) {
  Tensor x = mul(random_leaf({3, 2, 6}, gen, false), 3.0).detach().set_requires_grad(true);
  Tensor b = random_leaf({6}, gen);
  expect_gradients_match([](const Inputs& in) { return bias_gelu(in[0], in[1]); }, {x, b});
}

// Note [Bias and GELU in one pass]: gelu(add(x, bias)) to the bit for the result and x's
// gradient; the bias's gradient sums the same values in another order.
TEST_F(OpGradient, BiasGeluIsTheComposedOps) {
  const Tensor x0 = mul(random_leaf({37, 24}, gen, false), 3.0), b0 = random_leaf({24}, gen, false);
  auto run = [&](bool fused) {
    Tensor x = cast(x0, DType::F32).set_requires_grad(true),
           b = cast(b0, DType::F32).set_requires_grad(true);
    Tensor y = fused ? bias_gelu(x, b) : gelu(add(x, b));
    sum(mul(y, y)).backward();
    return std::vector<std::vector<float>>{y.to_vector<float>(), x.grad().to_vector<float>(),
                                           b.grad().to_vector<float>()};
  };
  const auto fused = run(true), composed = run(false);
  EXPECT_EQ(fused[0], composed[0]) << "the result";
  EXPECT_EQ(fused[1], composed[1]) << "x's gradient";
  ASSERT_EQ(fused[2].size(), composed[2].size());
  for (size_t i = 0; i < fused[2].size(); ++i)
    EXPECT_NEAR(fused[2][i], composed[2][i], 1e-5 * std::max(1.0f, std::abs(composed[2][i])));
}

TEST_F(OpGradient, BiasGeluRefusesABiasOfAnotherWidth) {
  try {
    bias_gelu(random_leaf({4, 3}, gen), random_leaf({4}, gen));
    FAIL() << "x [4, 3] with bias [4] must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bias_gelu: expected x [..., n] and bias [n]; got x "
                                         "[4, 3], bias [4]"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(OpGradient, AddLayerNorm) {
  Tensor x = random_leaf({3, 2, 8}, gen), r = random_leaf({3, 2, 8}, gen);
  Tensor w = random_leaf({8}, gen), b = random_leaf({8}, gen);
  expect_gradients_match(
      [](const Inputs& in) {
        AddNorm out = add_layer_norm(in[0], in[1], in[2], in[3], 1e-5);
        return add(out.normed, mul(out.sum, 0.7));
      },
      {x, r, w, b});
}

TEST_F(OpGradient, AddRmsNorm) {
  Tensor x = random_leaf({3, 2, 8}, gen), r = random_leaf({3, 2, 8}, gen);
  Tensor w = random_leaf({8}, gen);
  expect_gradients_match(
      [](const Inputs& in) {
        AddNorm out = add_rms_norm(in[0], in[1], in[2], 1e-5);
        return add(out.normed, mul(out.sum, 0.7));
      },
      {x, r, w});
}

// add then layer_norm (rms_norm), bit for bit in f32, the gradients too: the one pass computes
// each value as the two ops do, and the residual's gradient joins the norm's by one addition.
TEST_F(OpGradient, AddLayerNormIsBitwiseTheComposedOps) {
  const Tensor x0 = random_leaf({5, 3, 16}, gen, false), r0 = random_leaf({5, 3, 16}, gen, false);
  const Tensor w0 = random_leaf({16}, gen, false), b0 = random_leaf({16}, gen, false);
  const Tensor up0 = random_leaf({5, 3, 16}, gen, false);  // weighs the sum's own use
  auto run = [&](bool fused) {
    auto leaf = [](const Tensor& t) { return cast(t, DType::F32).set_requires_grad(true); };
    Tensor x = leaf(x0), r = leaf(r0), w = leaf(w0), b = leaf(b0);
    std::vector<std::vector<float>> all;
    for (const bool rms : {false, true}) {
      AddNorm out;
      if (fused) {
        out = rms ? add_rms_norm(x, r, w, 1e-5) : add_layer_norm(x, r, w, b);
      } else {
        out.sum = add(x, r);
        out.normed = rms ? rms_norm(out.sum, w, 1e-5) : layer_norm(out.sum, w, b);
      }
      sum(add(mul(out.normed, out.normed), mul(out.sum, cast(up0, DType::F32)))).backward();
      all.push_back(out.sum.to_vector<float>());
      all.push_back(out.normed.to_vector<float>());
      for (const Tensor& t : {x, r, w, b})
        all.push_back(t.grad().to_vector<float>());
    }
    return all;
  };
  const auto fused = run(true), composed = run(false);
  const char* parts[] = {"sum", "normed", "dx", "dresidual", "dweight", "dbias"};
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_EQ(fused[i], composed[i]) << (i < 6 ? "add_layer_norm " : "add_rms_norm ")
                                      << parts[i % 6];
}

TEST_F(OpGradient, AddLayerNormRefusesAWeightOfAnotherWidth) {
  try {
    add_layer_norm(random_leaf({2, 8}, gen), random_leaf({2, 8}, gen), random_leaf({6}, gen),
                   random_leaf({8}, gen));
    FAIL() << "a weight [6] for rows of 8 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add_layer_norm: expected weight and bias of shape [8] "
                                         "for input [2, 8]; got [6] and [8]"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(OpGradient, RmsNorm) {
  Tensor x = random_leaf({3, 2, 8}, gen), w = random_leaf({8}, gen);
  expect_gradients_match([](const Inputs& in) { return rms_norm(in[0], in[1], 1e-5); }, {x, w});
}

TEST_F(OpGradient, Softmax) {
  Tensor x = random_leaf({3, 7}, gen);
  expect_gradients_match([](const Inputs& in) { return softmax(in[0]); }, {x});
}

TEST_F(OpGradient, CausalSoftmax) {
  Tensor x = random_leaf({2, 5, 5}, gen);
  expect_gradients_match([](const Inputs& in) { return softmax(in[0], true); }, {x});
}

TEST_F(OpGradient, CausalAttentionOnFusedProjectionViews) {
  // q, k, v as [B, H, T, D] views into one [B, T, 3*H*D] tensor, the way GPT uses them.
  const int64_t B = 2, H = 2, T = 4, D = 3;
  Tensor qkv = random_leaf({B, T, 3 * H * D}, gen);
  expect_gradients_match(
      [&](const Inputs& in) {
        std::vector<Tensor> parts = split(in[0], {H * D, H * D, H * D}, -1);
        auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).permute({0, 2, 1, 3}); };
        return causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]));
      },
      {qkv});
}

TEST_F(OpGradient, CausalAttentionOnThePackedProjection) {
  const int64_t B = 2, H = 2, T = 4, D = 3;
  Tensor qkv = random_leaf({B, T, 3 * H * D}, gen);
  expect_gradients_match([&](const Inputs& in) { return causal_attention_packed(in[0], H); },
                         {qkv});
}

// Note [Attention on the packed projection]: the packed op is causal_attention over the split
// views, bit for bit, forward and backward, in f32 and under bf16 autocast (which casts the
// packed projection once where the views are cast one by one), from a packed input that is
// itself a strided view too; its gradient is one tensor of the projection's shape.
TEST_F(OpGradient, PackedAttentionHasTheBitsOfAttentionOnSplitViews) {
  const int64_t B = 2, H = 3, T = 70, D = 8, C = H * D;
  const Tensor wide = random_leaf({B, T, 3 * C + 5}, gen, false).to(DType::F32);
  const Tensor weights = random_leaf({B, T, C}, gen, false).to(DType::F32);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 autocast" : "f32");
    auto run = [&](bool packed) {
      Tensor leaf = wide.detach().set_requires_grad(true);
      Tensor qkv = leaf.narrow(2, 5, 3 * C);  // rows 3C + 5 apart
      std::optional<AutocastGuard> autocast;
      if (bf16) autocast.emplace(DType::BF16);
      Tensor y;
      if (packed) {
        y = causal_attention_packed(qkv, H);
      } else {
        std::vector<Tensor> parts = split(qkv, {C, C, C}, -1);
        auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).permute({0, 2, 1, 3}); };
        y = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]))
                .permute({0, 2, 1, 3})
                .reshape({B, T, C});
      }
      autocast.reset();
      EXPECT_EQ(y.shape(), (Shape{B, T, C}));
      sum(mul(y.to(DType::F32), weights)).backward();
      return std::pair{y.to(DType::F32).contiguous().to_vector<float>(),
                       leaf.grad().contiguous().to_vector<float>()};
    };
    const auto packed = run(true), views = run(false);
    EXPECT_EQ(packed.first, views.first);
    EXPECT_EQ(packed.second, views.second);
  }
}

TEST_F(OpGradient, PackedAttentionRefusesAProjectionItCannotSplitIntoHeads) {
  for (const auto& [shape, heads] : std::vector<std::pair<Shape, int64_t>>{
           {{1, 4, 12}, 3}, {{1, 4, 12}, 0}, {{4, 12}, 2}, {{1, 4, 0}, 1}}) {
    try {
      causal_attention_packed(Tensor::zeros(shape), heads);
      FAIL() << shape_str(shape) << " with " << heads << " heads must be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expected qkv [B, T, 3 H D]"), std::string::npos)
          << e.what();
    }
  }
}

TEST_F(OpGradient, CausalAttentionMatchesComposedOps) {
  Tensor q = random_leaf({1, 2, 5, 4}, gen), k = random_leaf({1, 2, 5, 4}, gen),
         v = random_leaf({1, 2, 5, 4}, gen);
  Tensor fused = causal_attention(q, k, v);
  Tensor scores = mul(matmul(q, transpose(k, -1, -2)), 0.5);
  Tensor composed = matmul(softmax(scores, true), v);
  std::vector<double> a = fused.to_vector<double>(), b = composed.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-12);
}

TEST_F(OpGradient, CausalAttentionWithGroupedKeyValueHeads) {
  // 4 query heads over 2 key/value heads: heads 0, 1 read kv head 0; heads 2, 3 kv head 1.
  Tensor q = random_leaf({2, 4, 5, 3}, gen), k = random_leaf({2, 2, 5, 3}, gen),
         v = random_leaf({2, 2, 5, 3}, gen);
  expect_gradients_match(
      [](const Inputs& in) { return causal_attention(in[0], in[1], in[2]); }, {q, k, v});
}

// Over many query and key tiles (64 x 256 in kernels/cpu/attention.cpp: T = 300 takes the online
// softmax's rescaling and the diagonal's partial tiles), with grouped heads: output and every
// gradient as the composed ops give them, repeated key/value heads and a masked softmax.
TEST_F(OpGradient, CausalAttentionMatchesComposedOpsOverManyTiles) {
  const int64_t B = 1, H = 4, KV = 2, T = 300, D = 8;
  const Tensor random_q = random_leaf({B, H, T, D}, gen, false),
               random_k = random_leaf({B, KV, T, D}, gen, false),
               random_v = random_leaf({B, KV, T, D}, gen, false);
  Tensor weights = random_leaf({B, H, T, D}, gen, false);
  auto repeat = [&](const Tensor& t) {
    return t.reshape({B, KV, 1, T, D}).expand({B, KV, H / KV, T, D}).reshape({B, H, T, D});
  };
  auto run = [&](bool fused) {
    Tensor q = random_q.detach().set_requires_grad(true), k = random_k.detach().set_requires_grad(true),
           v = random_v.detach().set_requires_grad(true);
    Tensor out;
    if (fused) {
      out = causal_attention(q, k, v);
    } else {
      Tensor scores = mul(matmul(q, transpose(repeat(k), -1, -2)), 1.0 / std::sqrt(double(D)));
      out = matmul(softmax(scores, true), repeat(v));
    }
    sum(mul(out, weights)).backward();
    std::vector<std::vector<double>> all{out.contiguous().to_vector<double>()};
    for (const Tensor& t : {q, k, v})
      all.push_back(t.grad().contiguous().to_vector<double>());
    return all;
  };
  const auto fused = run(true), composed = run(false);
  for (size_t part = 0; part < fused.size(); ++part) {
    ASSERT_EQ(fused[part].size(), composed[part].size());
    double worst = 0;
    for (size_t i = 0; i < fused[part].size(); ++i)
      worst = std::max(worst, std::abs(fused[part][i] - composed[part][i]));
    EXPECT_LT(worst, 1e-12) << "part " << part << " (out, dq, dk, dv)";
  }
}

TEST_F(OpGradient, CausalAttentionRefusesHeadsItCannotGroup) {
  Tensor q = random_leaf({1, 3, 4, 2}, gen), kv = random_leaf({1, 2, 4, 2}, gen);
  try {
    causal_attention(q, kv, kv);
    FAIL() << "3 query heads over 2 key/value heads must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("H_kv dividing H"), std::string::npos) << e.what();
  }
}

TEST_F(OpGradient, CrossEntropy) {
  Tensor logits = random_leaf({4, 6}, gen);
  Tensor targets = Tensor::from_vector<int64_t>({0, 5, 2, 5}, {4});
  expect_gradients_match([&](const Inputs& in) { return cross_entropy(in[0], targets); }, {logits});
}

TEST_F(OpGradient, LinearCrossEntropy) {
  Tensor x = random_leaf({5, 3}, gen), weight = random_leaf({7, 3}, gen);
  Tensor targets = Tensor::from_vector<int64_t>({0, 6, 2, 6, 3}, {5});
  expect_gradients_match(
      [&](const Inputs& in) { return linear_cross_entropy(in[0], in[1], targets); }, {x, weight});
}

// Note [The classifier without its logits]: chunks of any size give the composed ops' loss
// and gradients (to the order of dweight's sums), for a loss's gradient other than 1 too, and
// a retained graph's second backward gives the same gradients again.
TEST_F(OpGradient, LinearCrossEntropyInChunksMatchesTheComposedOps) {
  const int64_t rows = 11, width = 4, vocab = 9;
  const Tensor random_x = random_leaf({rows, width}, gen, false),
               random_w = random_leaf({vocab, width}, gen, false);
  std::vector<int64_t> picks;
  for (int64_t r = 0; r < rows; ++r)
    picks.push_back((r * 5 + 2) % vocab);
  const Tensor targets = Tensor::from_vector(picks, {rows});
  // The loss, then dx and dweight of 3 x loss (backward twice: the second doubles them).
  auto run = [&](int64_t chunk_rows) {
    Tensor x = random_x.detach().set_requires_grad(true),
           w = random_w.detach().set_requires_grad(true);
    Tensor loss = chunk_rows == 0 ? cross_entropy(matmul(x, transpose(w, 0, 1)), targets)
                                  : detail::linear_cross_entropy_in_chunks(x, w, targets,
                                                                          chunk_rows);
    Tensor scaled = mul(loss, 3.0);
    scaled.backward(Tensor(), /*retain_graph=*/true);
    std::vector<std::vector<double>> all{loss.to_vector<double>(), x.grad().to_vector<double>(),
                                         w.grad().to_vector<double>()};
    scaled.backward();
    all.push_back(x.grad().to_vector<double>());
    all.push_back(w.grad().to_vector<double>());
    return all;
  };
  const auto composed = run(0);
  for (int64_t chunk_rows : {int64_t{1}, int64_t{3}, int64_t{4}, rows, rows + 5}) {
    const auto chunked = run(chunk_rows);
    for (size_t part = 0; part < chunked.size(); ++part) {
      ASSERT_EQ(chunked[part].size(), composed[part].size());
      for (size_t i = 0; i < chunked[part].size(); ++i) {
        EXPECT_NEAR(chunked[part][i], composed[part][i], 1e-13)
            << "chunks of " << chunk_rows << ", part " << part
            << " (loss, dx, dweight, then both after a second backward)";
      }
    }
  }
}

TEST_F(OpGradient, LinearCrossEntropyRefusesMismatchedShapes) {
  const Tensor x = random_leaf({4, 3}, gen), weight = random_leaf({6, 2}, gen);
  const Tensor targets = Tensor::from_vector<int64_t>({0, 1, 2, 3}, {4});
  try {
    linear_cross_entropy(x, weight, targets);
    FAIL() << "x [4, 3] against weight [6, 2] must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected x [N, C], weight [V, C] and targets [N]"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(OpGradient, EmbeddingWithRepeatedIndices) {
  Tensor weight = random_leaf({5, 3}, gen);
  Tensor idx = Tensor::from_vector<int32_t>({1, 4, 1, 0, 1, 2}, {2, 3});
  expect_gradients_match([&](const Inputs& in) { return embedding(idx, in[0]); }, {weight});
}

TEST_F(OpGradient, Reductions) {
  Tensor x = random_leaf({2, 3, 4}, gen);
  expect_gradients_match([](const Inputs& in) { return sum(in[0]); }, {x});
  expect_gradients_match([](const Inputs& in) { return sum(in[0], {0, 2}); }, {x});
  expect_gradients_match([](const Inputs& in) { return sum(in[0], {1}, true); }, {x});
  expect_gradients_match([](const Inputs& in) { return mean(in[0]); }, {x});
  expect_gradients_match([](const Inputs& in) { return mean(in[0], {-1}); }, {x});
  expect_gradients_match([](const Inputs& in) { return max(in[0], 1); }, {x});
  expect_gradients_match([](const Inputs& in) { return max(in[0], 2, true); }, {x});
  expect_gradients_match([](const Inputs& in) { return max(in[0]); }, {x});
}

TEST_F(OpGradient, ShapeOps) {
  Tensor x = random_leaf({2, 3, 4}, gen);
  expect_gradients_match([](const Inputs& in) { return reshape(in[0], {4, -1}); }, {x});
  expect_gradients_match([](const Inputs& in) { return permute(in[0], {2, 0, 1}); }, {x});
  expect_gradients_match([](const Inputs& in) { return transpose(in[0], 0, 2); }, {x});
  expect_gradients_match([](const Inputs& in) { return narrow(in[0], 2, 1, 2); }, {x});
  expect_gradients_match([](const Inputs& in) { return expand(in[0], {5, 2, 3, 4}); }, {x});
  expect_gradients_match([](const Inputs& in) { return contiguous(transpose(in[0], 1, 2)); }, {x});
  // reshape of a non-contiguous view (needs a copy)
  expect_gradients_match([](const Inputs& in) { return reshape(transpose(in[0], 0, 1), {-1}); },
                         {x});
}

TEST_F(OpGradient, ConcatAndSplit) {
  Tensor a = random_leaf({2, 3}, gen), b = random_leaf({2, 2}, gen);
  expect_gradients_match([](const Inputs& in) { return concat({in[0], in[1]}, 1); }, {a, b});
  Tensor x = random_leaf({5, 2}, gen);
  // Only two of the three pieces are used: the unused one contributes zero gradient.
  expect_gradients_match(
      [](const Inputs& in) {
        std::vector<Tensor> parts = split(in[0], {1, 3, 1}, 0);
        return concat({parts[2], parts[0]}, 0);
      },
      {x});
}

TEST_F(OpGradient, CastBackwardReturnsInputDtype) {
  Tensor x = random_leaf({3}, gen);
  Tensor y = cast(x, DType::F32);
  sum(cast(y, DType::F64)).backward();
  EXPECT_EQ(x.grad().dtype(), DType::F64);
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>({1, 1, 1}));
}

}  // namespace
}  // namespace loom
