// The autograd engine: accumulation, grad mode, grad-ready hooks, recomputation, custom ops.

#include <gtest/gtest.h>

#include "tensor/autograd/function.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

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

TEST(Autograd, GradientFlowsThroughViewsIntoTheBase) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true);
  Tensor y = mul(x.transpose(0, 1).narrow(0, 1, 2), 2.0);  // rows 1..2 of x^T
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), std::vector<double>({0, 2, 2, 0, 2, 2}));
}

}  // namespace
}  // namespace loom
