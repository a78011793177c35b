// The autograd engine: accumulation, grad mode, grad-ready hooks, recomputation, custom ops.

#include <algorithm>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "tensor/allocator.h"
#include "tensor/autograd/function.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom {
namespace {

Tensor leaf(std::vector<double> values) {
  int64_t n = static_cast<int64_t>(values.size());
  return Tensor::from_vector(values, {n}).set_requires_grad(true);
}

TEST(Autograd, GradientsAccumulateAcrossBackwardPasses) {
  Tensor x = leaf({1, 2, 3});
  sum(mul(x, x)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>({2, 4, 6}));
  sum(mul(x, 3.0)).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>({5, 7, 9}));
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = leaf({1, 2});
  Tensor y;
  {
    NoGradGuard guard;
    y = mul(x, 2.0);
    EXPECT_FALSE(grad_mode_enabled());
  }
  EXPECT_TRUE(grad_mode_enabled());
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(sum(y).backward(), Error);
}

TEST(Autograd, GradReadyHookFiresOnceWithTheCompleteGradient) {
  Tensor w = leaf({1, 1});
  Tensor x = Tensor::from_vector<double>({2, 3}, {2});
  int calls = 0;
  std::vector<double> seen;
  w.register_grad_ready_hook([&](Tensor& p) {
    ++calls;
    seen = p.grad().to_vector<double>();
  });
  // w is used twice; the hook must see the sum of both contributions.
  Tensor loss = add(sum(mul(w, x)), sum(mul(w, w)));
  loss.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, std::vector<double>({4, 5}));
}

TEST(Autograd, HooksFireFromTheLastLayerToTheFirst) {
  Tensor w1 = leaf({0.5}), w2 = leaf({0.25}), w3 = leaf({2});
  std::vector<int> order;
  w1.register_grad_ready_hook([&](Tensor&) { order.push_back(1); });
  w2.register_grad_ready_hook([&](Tensor&) { order.push_back(2); });
  w3.register_grad_ready_hook([&](Tensor&) { order.push_back(3); });
  Tensor x = Tensor::from_vector<double>({1}, {1});
  Tensor h = mul(mul(mul(x, w1), w2), w3);
  sum(h).backward();
  EXPECT_EQ(order, std::vector<int>({3, 2, 1}));
}

// Cross-entropy's backward writes the logits' gradient over the logits when that is the last
// use of them and nothing else holds them (Node::last_use): one [rows, vocab] buffer fewer.
// Logits a caller keeps, and a graph kept for a second backward, see no change.
TEST(Autograd, CrossEntropyReusesTheLogitsOnlyWhenNothingElseSeesThem) {
  Generator gen(3);
  Tensor x = Tensor::empty({6, 4}), w = Tensor::empty({4, 10});
  uniform_(x, -1.0, 1.0, gen);
  uniform_(w, -1.0, 1.0, gen);
  x.set_requires_grad(true);
  const Tensor targets = Tensor::from_vector<int64_t>({1, 9, 0, 4, 4, 7}, {6});
  const size_t logits_bytes = 6 * 10 * sizeof(float);
  Allocator& cpu = allocator_for(Device::cpu());
  cross_entropy(matmul(x, w), targets).backward();  // first-use buffers (packing) out of the way
  x.set_grad(Tensor());

  Tensor kept = matmul(x, w);
  const std::vector<float> kept_values = kept.to_vector<float>();
  Tensor loss_of_kept = cross_entropy(kept, targets);
  const size_t before_kept = cpu.stats().allocations;
  loss_of_kept.backward();
  const size_t allocations_kept = cpu.stats().allocations - before_kept;
  EXPECT_EQ(kept.to_vector<float>(), kept_values) << "logits the caller holds were overwritten";
  const std::vector<float> want = x.grad().to_vector<float>();

  x.set_grad(Tensor());
  Tensor loss = cross_entropy(matmul(x, w), targets);  // the logits die with this statement
  const size_t before_released = cpu.stats().allocations;
  loss.backward();
  EXPECT_EQ(cpu.stats().allocations - before_released, allocations_kept - 1)
      << "the logits' gradient took a buffer of its own (" << logits_bytes << " bytes)";
  EXPECT_EQ(x.grad().to_vector<float>(), want);

  x.set_grad(Tensor());
  Tensor twice = cross_entropy(matmul(x, w), targets);
  twice.backward(Tensor(), /*retain_graph=*/true);
  twice.backward();
  std::vector<float> doubled = want;
  for (float& v : doubled)
    v += v;
  EXPECT_EQ(x.grad().to_vector<float>(), doubled) << "the retained graph's logits changed";
}

// The ops a CPU backward of `loss` runs, each with the bytes it writes (Note [Profiling CPU
// ops]).
std::vector<std::pair<std::string, double>> backward_ops(const Tensor& loss) {
  OpProfile profile;
  {
    OpProfileScope scope(profile);
    loss.backward();
  }
  std::vector<std::pair<std::string, double>> ops;
  for (const OpProfile::Entry& entry : profile.entries())
    ops.emplace_back(entry.cost.op, entry.cost.bytes_written);
  return ops;
}

bool runs(const std::vector<std::pair<std::string, double>>& ops, const std::string& op,
          double bytes_written) {
  return std::find(ops.begin(), ops.end(), std::pair{op, bytes_written}) != ops.end();
}

// A tied table: the output projection's gradient arrives first, and the embedding's backward
// adds its rows into it (Note [Adding into the partial gradient]): no table of zeros, no sum
// of two tables, and the values of that sum. A sum that something else also holds (add's
// backward hands one tensor to both operands) is left alone: the other operand's gradient
// keeps its values.
TEST(Autograd, AnEmbeddingAddsIntoTheGradientSummedBeforeItOnlyWhenNothingElseSeesIt) {
  const Tensor tokens = Tensor::from_vector<int64_t>({3, 0, 3, 1, 3}, {5});
  const Tensor x = Tensor::from_vector<double>({1, -2, 0.5, 4, 3, -1}, {2, 3});
  const Tensor e =
      Tensor::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {5, 3});
  // The embedding's gradient: row r gets the sum of e's rows whose token is r (row 3: e's
  // rows 0, 2 and 4).
  const std::vector<double> scattered = {4, 5, 6, 10, 11, 12, 0, 0, 0, 21, 24, 27};
  // The projection's: sum over x's rows of x (the logits' gradient is 1).
  const std::vector<double> projected = {5, 1, -0.5, 5, 1, -0.5, 5, 1, -0.5, 5, 1, -0.5};
  std::vector<double> want(12);
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = projected[i] + scattered[i];

  Tensor w = Tensor::zeros({4, 3}, DType::F64).set_requires_grad(true);
  Tensor looked_up = sum(mul(embedding(tokens, w), e));  // first, as a model's input
  Tensor tied = add(looked_up, sum(matmul(x, transpose(w, 0, 1))));
  const auto ops = backward_ops(tied);
  const double table = 12 * sizeof(double);
  EXPECT_EQ(w.grad().to_vector<double>(), want);
  EXPECT_FALSE(runs(ops, "fill_", table)) << "the embedding zeroed a table of its own";
  EXPECT_FALSE(runs(ops, "add", table)) << "the pass added two tables";

  // z's accumulator exists before the embedding, so it runs after it and still holds the
  // tensor add's backward gave both operands while the embedding runs.
  Tensor w2 = Tensor::zeros({4, 3}, DType::F64).set_requires_grad(true);
  Tensor z = Tensor::zeros({4, 3}, DType::F64).set_requires_grad(true);
  Tensor early = sum(mul(z, 2.0));
  Tensor looked = sum(mul(embedding(tokens, w2), e));
  const Tensor ones = Tensor::full({4, 3}, 1.0, DType::F64);  // a gradient of its own for add
  Tensor shared = add(early, add(looked, sum(mul(add(w2, z), ones))));
  const auto shared_ops = backward_ops(shared);
  EXPECT_EQ(z.grad().to_vector<double>(), std::vector<double>(12, 3.0))
      << "the embedding added into a gradient that another operand holds";
  std::vector<double> want2(12);
  for (size_t i = 0; i < want2.size(); ++i)
    want2[i] = 1 + scattered[i];
  EXPECT_EQ(w2.grad().to_vector<double>(), want2);
  EXPECT_TRUE(runs(shared_ops, "fill_", table));
  EXPECT_TRUE(runs(shared_ops, "add", table));
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = leaf({1, 2});
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>({4, 8}));
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Autograd, CheckpointGivesBitwiseEqualGradients) {
  Tensor w = Tensor::from_vector<float>({0.3f, -0.7f, 1.1f, 0.2f}, {2, 2}).set_requires_grad(true);
  Tensor b = Tensor::from_vector<float>({0.1f, -0.2f}, {2}).set_requires_grad(true);
  Tensor x0 = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}).set_requires_grad(true);
  auto block = [&](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{gelu(linear(in[0], w, b))};
  };
  sum(block({x0})[0]).backward();
  auto gw = w.grad().to_vector<float>(), gb = b.grad().to_vector<float>(),
       gx = x0.grad().to_vector<float>();
  w.set_grad(Tensor());
  b.set_grad(Tensor());
  x0.set_grad(Tensor());
  Tensor out = autograd::checkpoint(block, {x0})[0];
  sum(out).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), gw);
  EXPECT_EQ(b.grad().to_vector<float>(), gb);
  EXPECT_EQ(x0.grad().to_vector<float>(), gx);
}

TEST(Autograd, CustomOp) {
  autograd::CustomOp cube{.name = "cube",
                          .forward =
                              [](autograd::Context& ctx, const std::vector<Tensor>& in) {
                                ctx.save(in[0]);
                                return std::vector<Tensor>{mul(mul(in[0], in[0]), in[0])};
                              },
                          .backward =
                              [](autograd::Context& ctx, const std::vector<Tensor>& g) {
                                Tensor x = ctx.saved(0);
                                return std::vector<Tensor>{mul(g[0], mul(mul(x, x), 3.0))};
                              }};
  Tensor x = leaf({1, 2, -3});
  Tensor y = autograd::apply(cube, {x})[0];
  EXPECT_EQ(y.to_vector<double>(), std::vector<double>({1, 8, -27}));
  EXPECT_EQ(y.grad_fn()->name(), "cube");
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>({3, 12, 27}));
}

// A small stage of a model: linear, layer norm, gelu, a custom op and a weight used twice.
struct SplitStage {
  Tensor w1, b1, ln_w, ln_b, w2, b2;
  std::shared_ptr<int> scale_gradients = std::make_shared<int>(0);  // computed by scale_by
  autograd::CustomOp scale_by{
      .name = "scale_by",
      .forward = [](autograd::Context& ctx, const std::vector<Tensor>& in) {
        ctx.save(in[0]);
        ctx.save(in[1]);
        return std::vector<Tensor>{mul(in[0], in[1])};
      },
      .backward = [counter = scale_gradients](autograd::Context& ctx, const std::vector<Tensor>& g) {
        *counter += ctx.needs_input_grad(1) ? 1 : 0;
        Tensor gx = ctx.needs_input_grad(0) ? mul(g[0], ctx.saved(1)) : Tensor();
        Tensor gs = ctx.needs_input_grad(1) ? sum_to(mul(g[0], ctx.saved(0)), ctx.saved(1).shape())
                                            : Tensor();
        return std::vector<Tensor>{gx, gs};
      }};

  SplitStage() {
    Generator gen(7);
    auto param = [&](Shape shape) {
      Tensor t = Tensor::empty(shape, DType::F32);
      normal_(t, 0.0, 0.5, gen);
      return t.set_requires_grad(true);
    };
    w1 = param({4, 6}), b1 = param({6}), ln_w = param({6}), ln_b = param({6});
    w2 = param({6, 4}), b2 = param({4});
  }
  std::vector<Tensor> parameters() const { return {w1, b1, ln_w, ln_b, w2, b2}; }
  Tensor forward(const Tensor& x) const {
    Tensor h = gelu(layer_norm(linear(x, w1, b1), ln_w, ln_b));
    h = autograd::apply(scale_by, {h, ln_w})[0];  // ln_w feeds two nodes
    return linear(h, w2, b2);
  }
  void zero_grad() const {
    for (const Tensor& p : parameters())
      p.set_grad(Tensor());
  }
};

Tensor stage_loss(const SplitStage& stage, const Tensor& x) {
  Tensor y = stage.forward(x);
  return sum(mul(y, y));
}

std::vector<std::vector<float>> gradients_of(const std::vector<Tensor>& tensors) {
  std::vector<std::vector<float>> out;
  for (const Tensor& t : tensors)
    out.push_back(t.grad().to_vector<float>());
  return out;
}

Tensor stage_input(uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::empty({3, 4}, DType::F32);
  normal_(x, 0.0, 1.0, gen);
  return x.set_requires_grad(true);
}

TEST(Autograd, SplitBackwardGivesTheGradientsOfOnePassBitwise) {
  SplitStage stage;
  Tensor whole_x = stage_input(1);
  stage_loss(stage, whole_x).backward();
  const auto whole = gradients_of(stage.parameters());
  stage.zero_grad();

  Tensor x = stage_input(1);
  autograd::WeightGradients rest = autograd::run_backward_input({stage_loss(stage, x)}, {Tensor()}, {x});
  // The input's gradient is there and no weight's yet.
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().to_vector<float>(), whole_x.grad().to_vector<float>());
  for (const Tensor& p : stage.parameters())
    EXPECT_FALSE(p.grad().defined());
  const int whole_pass_scale_gradients = 1;
  EXPECT_EQ(*stage.scale_gradients, whole_pass_scale_gradients);  // not computed again yet
  ASSERT_FALSE(rest.empty());
  rest.run();
  EXPECT_EQ(*stage.scale_gradients, whole_pass_scale_gradients + 1);
  EXPECT_TRUE(rest.empty());
  EXPECT_EQ(gradients_of(stage.parameters()), whole);
}

// The zero-bubble order: input halves of two micro-batches, then their weight halves.
TEST(Autograd, WeightHalvesRunLaterAccumulateAsWholePassesDo) {
  SplitStage stage;
  for (uint64_t k : {1, 2})
    stage_loss(stage, stage_input(k)).backward();
  const auto whole = gradients_of(stage.parameters());
  stage.zero_grad();

  int hook_calls = 0;
  stage.w1.register_grad_ready_hook([&](Tensor&) { ++hook_calls; });
  std::vector<autograd::WeightGradients> rests;
  for (uint64_t k : {1, 2}) {
    Tensor x = stage_input(k);
    rests.push_back(autograd::run_backward_input({stage_loss(stage, x)}, {Tensor()}, {x}));
  }
  EXPECT_EQ(hook_calls, 0);
  for (autograd::WeightGradients& rest : rests)
    rest.run();
  EXPECT_EQ(hook_calls, 2);
  EXPECT_EQ(gradients_of(stage.parameters()), whole);
}

TEST(Autograd, SplitBackwardWithoutInputsLeavesEverythingForLater) {
  SplitStage stage;
  Tensor x = stage_input(3).detach();  // the first stage: tokens, no gradient to send back
  stage_loss(stage, x).backward();
  const auto whole = gradients_of(stage.parameters());
  stage.zero_grad();

  autograd::WeightGradients rest = autograd::run_backward_input({stage_loss(stage, x)}, {Tensor()}, {});
  for (const Tensor& p : stage.parameters())
    EXPECT_FALSE(p.grad().defined());
  rest.run();
  EXPECT_EQ(gradients_of(stage.parameters()), whole);
}

TEST(Autograd, SplitBackwardThroughACheckpointedRegion) {
  SplitStage stage;
  auto loss_of = [&](const Tensor& x) {
    Tensor y = autograd::checkpoint(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{stage.forward(in[0])}; },
        {x})[0];
    return sum(mul(y, y));
  };
  Tensor whole_x = stage_input(4);
  loss_of(whole_x).backward();
  const auto whole = gradients_of(stage.parameters());
  stage.zero_grad();

  Tensor x = stage_input(4);
  autograd::WeightGradients rest = autograd::run_backward_input({loss_of(x)}, {Tensor()}, {x});
  rest.run();
  EXPECT_EQ(x.grad().to_vector<float>(), whole_x.grad().to_vector<float>());
  EXPECT_EQ(gradients_of(stage.parameters()), whole);
}

TEST(Autograd, SplitBackwardFreesTheGraph) {
  SplitStage stage;
  Tensor x = stage_input(5);
  Tensor loss = stage_loss(stage, x);
  autograd::WeightGradients rest = autograd::run_backward_input({loss}, {Tensor()}, {x});
  rest.run();
  EXPECT_THROW(loss.backward(), Error);
  EXPECT_THROW(autograd::run_backward_input({loss}, {Tensor()}, {stage.w1}), Error);
}

// Zero-size tensors are ordinary tensors: created, viewed, computed with and differentiated
// (the last token's narrow of a sequence, an empty batch), as in PyTorch.
TEST(Autograd, ZeroSizeTensorsThroughOpsAndTheirGradients) {
  EXPECT_EQ(Tensor::zeros({3, 0}).numel(), 0);
  EXPECT_TRUE(Tensor::zeros({3, 0}).is_contiguous());
  Tensor x = Tensor::ones({3, 4}).set_requires_grad(true);
  Tensor tail = x.narrow(1, 4, 0);  // past the last column: [3, 0]
  EXPECT_EQ(tail.shape(), (Shape{3, 0}));
  Tensor w = Tensor::ones({0, 2}).set_requires_grad(true);
  Tensor y = matmul(tail, w);  // an empty sum: [3, 2] of zeros
  EXPECT_EQ(y.to_vector<float>(), std::vector<float>(6, 0.0f));
  Tensor loss = add(sum(mul(add(y, 1.0), 2.0)), sum(gelu(tail)));
  loss.backward();
  EXPECT_EQ(x.grad().to_vector<float>(), std::vector<float>(12, 0.0f));
  EXPECT_EQ(w.grad().shape(), (Shape{0, 2}));

  Tensor rows = Tensor::ones({0, 4}).set_requires_grad(true);  // an empty batch
  Tensor weight = Tensor::ones({4}).set_requires_grad(true);
  Tensor bias = Tensor::zeros({4}).set_requires_grad(true);
  Tensor h = layer_norm(rows, weight, bias);
  Tensor p = softmax(h);
  Tensor lin = linear(p, Tensor::ones({4, 3}).set_requires_grad(true), Tensor::zeros({3}));
  Tensor total = add(sum(lin), sum(concat({h, rows}, 1)));
  EXPECT_EQ(total.item(), 0.0);
  total.backward();
  EXPECT_EQ(rows.grad().shape(), (Shape{0, 4}));
  EXPECT_EQ(weight.grad().to_vector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(mean(Tensor::ones({0, 4}), {0}).shape(), (Shape{4}));
  EXPECT_EQ(reshape(Tensor::zeros({0, 4}), {4, 0}).shape(), (Shape{4, 0}));
  EXPECT_EQ(Tensor::zeros({2, 0}).transpose(0, 1).contiguous().shape(), (Shape{0, 2}));
}

TEST(Autograd, GradientFlowsThroughViewsIntoTheBase) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true);
  Tensor y = mul(x.transpose(0, 1).narrow(0, 1, 2), 2.0);  // rows 1..2 of x^T
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>({0, 2, 2, 0, 2, 2}));
}

}  // namespace
}  // namespace loom
