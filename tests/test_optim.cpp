// Optimizers (AdamW, SGD), gradient clipping and learning-rate schedules.
//
// Reference trajectories come from PyTorch 1.13 (Debian's python3-torch, CPU, one thread,
// foreach=False). The snippet that printed them, with the helpers that the C++ side mirrors
// (test_grad, test_init, make_params, set_test_grads):
//
//   import torch; torch.set_num_threads(1)
//   def grad(k, i, t): return (((i + 10 * k) * 7 + t * 3) % 11 - 5) * 0.125
//   def init(k, n): return [((i * 5 + 3 * k) % 9 - 4) * 0.25 for i in range(n)]
//   def params(dtype):
//       w = torch.tensor(init(0, 6), dtype=dtype).reshape(2, 3).requires_grad_()
//       b = torch.tensor(init(1, 4), dtype=dtype).requires_grad_()
//       return w, b
//   def set_grads(w, b, t, skip_b):
//       w.grad = torch.tensor([grad(0, i, t) for i in range(6)], dtype=w.dtype).reshape(2, 3)
//       b.grad = None if skip_b else torch.tensor([grad(1, i, t) for i in range(4)],
//                                                 dtype=b.dtype)
//   def show(x): print(", ".join(repr(float(v)) for v in x.detach().flatten().tolist()))
//   def adamw(dtype):
//       w, b = params(dtype)
//       opt = torch.optim.AdamW([{'params': [w], 'weight_decay': 0.1},
//                                {'params': [b], 'weight_decay': 0.0}],
//                               lr=1e-2, betas=(0.9, 0.95), eps=1e-8, foreach=False)
//       for t in range(5):
//           opt.param_groups[0]['lr'] = 0.01 * (t + 1) / 5
//           opt.param_groups[1]['lr'] = 0.02 * (t + 1) / 5
//           set_grads(w, b, t, skip_b=(t == 2))
//           opt.step()
//       for p in (w, b): show(p); show(opt.state[p]['exp_avg']); show(opt.state[p]['exp_avg_sq'])
//   def sgd(dtype, **kw):
//       w, b = params(dtype)
//       opt = torch.optim.SGD([w, b], foreach=False, **kw)
//       for t in range(4):
//           set_grads(w, b, t, skip_b=(t == 1))
//           opt.step()
//       for p in (w, b): show(p); show(opt.state[p]['momentum_buffer'])
//   for dt in (torch.float64, torch.float32):
//       adamw(dt)
//       sgd(dt, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)
//       sgd(dt, lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.02)

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "tensor/ops.h"

namespace loom::optim {
namespace {

// --- helpers mirroring the Python snippet above --------------------------------------------

double test_grad(int k, int i, int t) {
  return static_cast<double>(((i + 10 * k) * 7 + t * 3) % 11 - 5) * 0.125;
}

std::vector<double> test_init(int k, int n) {
  std::vector<double> values;
  for (int i = 0; i < n; ++i)
    values.push_back(static_cast<double>((i * 5 + 3 * k) % 9 - 4) * 0.25);
  return values;
}

template <typename T>
Tensor make_tensor(const std::vector<double>& values, const Shape& shape) {
  return Tensor::from_vector<T>(std::vector<T>(values.begin(), values.end()), shape);
}

template <typename T>
Tensor make_param(const std::vector<double>& values, const Shape& shape) {
  Tensor p = make_tensor<T>(values, shape);
  p.set_requires_grad(true);
  return p;
}

// w [2, 3] and b [4], as params(dtype) in the snippet.
template <typename T>
std::pair<Tensor, Tensor> make_params() {
  return {make_param<T>(test_init(0, 6), {2, 3}), make_param<T>(test_init(1, 4), {4})};
}

template <typename T>
void set_test_grads(Tensor& w, Tensor& b, int t, bool skip_b) {
  std::vector<double> gw;
  std::vector<double> gb;
  for (int i = 0; i < 6; ++i)
    gw.push_back(test_grad(0, i, t));
  for (int i = 0; i < 4; ++i)
    gb.push_back(test_grad(1, i, t));
  w.set_grad(make_tensor<T>(gw, {2, 3}));
  b.set_grad(skip_b ? Tensor() : make_tensor<T>(gb, {4}));
}

// Elementwise |actual - expected| <= rel * max(|expected|, max_j |expected_j| / 100): relative
// error, with a floor for entries that are small through cancellation.
void expect_close(const Tensor& actual_tensor, const std::vector<double>& expected, double rel,
                  const std::string& what) {
  std::vector<double> actual = actual_tensor.to_vector<double>();
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0.0;
  for (double e : expected)
    scale = std::max(scale, std::abs(e));
  for (size_t i = 0; i < expected.size(); ++i) {
    double tolerance = rel * std::max(std::abs(expected[i]), scale / 100.0);
    EXPECT_NEAR(actual[i], expected[i], tolerance) << what << " element " << i;
  }
}

template <typename T>
constexpr double kRel = std::is_same_v<T, double> ? 1e-12 : 1e-6;

// Expects fn() to throw loom::Error whose message contains `needle`.
template <typename F>
void expect_error(F&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected loom::Error containing \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// --- AdamW ---------------------------------------------------------------------------------

// Note [Capturable AdamW]: a captured step is a CUDA one; on the CPU the replay preparation
// and the device gradient scale are refused and leave the parameter as it was.
TEST(AdamW, ReplayPreparationAndGradientScaleAreForCudaParameters) {
  Tensor p = make_param<double>({0.5, -1.25}, {2});
  p.set_grad(make_tensor<double>({0.3, -0.02}, {2}));
  AdamW opt({p});
  expect_error([&] { opt.prepare_replay(); }, "without set_capturable(true)");
  opt.set_capturable(true);
  expect_error([&] { opt.prepare_replay(); }, "is not on a CUDA device");
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{0.5, -1.25}));
  opt.set_capturable(false);
  opt.set_grad_scale(Tensor::full({}, 0.5, DType::F32));
  expect_error([&] { opt.step(); }, "set_grad_scale() are for CUDA parameters");
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{0.5, -1.25}));
}

TEST(AdamW, FirstStepMatchesClosedForm) {
  const std::vector<double> p0 = {0.5, -1.25, 2.0, 0.0, -0.75};
  const std::vector<double> g = {0.3, -0.02, 0.0, 1e-3, -4.0};
  Tensor p = make_param<double>(p0, {5});
  p.set_grad(make_tensor<double>(g, {5}));
  AdamW opt({p});  // torch defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 1e-2
  opt.step();

  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 1e-2;
  std::vector<double> after = p.to_vector<double>();
  std::vector<double> m = opt.exp_avg(p).to_vector<double>();
  std::vector<double> v = opt.exp_avg_sq(p).to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    double mi = (1 - b1) * g[i];
    double vi = (1 - b2) * g[i] * g[i];
    double denom = std::sqrt(vi) / std::sqrt(1 - b2) + eps;
    double expected = p0[i] * (1 - lr * wd) - lr / (1 - b1) * mi / denom;
    EXPECT_NEAR(after[i], expected, 1e-15) << i;
    EXPECT_NEAR(m[i], mi, 1e-18) << i;
    EXPECT_NEAR(v[i], vi, 1e-18) << i;
    // The first step moves each element by -lr * sign(g) * |g| / (|g| + eps): within
    // lr * 1e-5 of -lr * sign(g) for these |g| >= 1e-3, and exactly 0 where g == 0.
    double sign = g[i] > 0 ? 1.0 : (g[i] < 0 ? -1.0 : 0.0);
    EXPECT_NEAR(after[i] - p0[i] * (1 - lr * wd), -lr * sign, lr * 1e-5) << i;
  }
  EXPECT_EQ(opt.param_step(p), 1);
  EXPECT_EQ(opt.step_count(), 1);
}

template <typename T>
void check_adamw_trajectory(const std::vector<std::vector<double>>& expected) {
  auto [w, b] = make_params<T>();
  AdamW opt({{.params = {w}, .weight_decay = 0.1}, {.params = {b}, .weight_decay = 0.0}},
            {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8});
  for (int t = 0; t < 5; ++t) {
    // Changing lr between steps must take effect.
    opt.param_groups()[0].lr = 0.01 * (t + 1) / 5;
    opt.param_groups()[1].lr = 0.02 * (t + 1) / 5;
    set_test_grads<T>(w, b, t, /*skip_b=*/t == 2);
    opt.step();
  }
  expect_close(w, expected[0], kRel<T>, "w");
  expect_close(opt.exp_avg(w), expected[1], kRel<T>, "w exp_avg");
  expect_close(opt.exp_avg_sq(w), expected[2], kRel<T>, "w exp_avg_sq");
  expect_close(b, expected[3], kRel<T>, "b");
  expect_close(opt.exp_avg(b), expected[4], kRel<T>, "b exp_avg");
  expect_close(opt.exp_avg_sq(b), expected[5], kRel<T>, "b exp_avg_sq");
  EXPECT_EQ(opt.param_step(w), 5);
  EXPECT_EQ(opt.param_step(b), 4);  // b had no gradient at t == 2
  EXPECT_EQ(opt.step_count(), 5);
  EXPECT_EQ(opt.exp_avg(w).dtype(), dtype_of<T>());
}

// adamw(torch.float64) of the snippet.
TEST(AdamW, MatchesTorchTrajectoryF64) {
  check_adamw_trajectory<double>({
      {-0.9846700562342771, 0.23503067067436406, -0.7448882765673496, 0.4925950159516149,
       -0.5050306369615084, 0.7598390791762939},
      {-0.05410625, 0.06908999999999998, -0.02429, -0.01508124999999999, 0.017901249999999994,
       -0.07547874999999998},
      {0.043667700195312534, 0.03266789062500003, 0.02715265625000002, 0.04814768066406254,
       0.02650195800781252, 0.033752387695312525},
      {-0.23787612387890958, 1.0225505738096066, -0.03922803811582833, -0.9704996712889996},
      {-0.022612499999999997, -0.0708125, 0.10634999999999999, -0.06559999999999999},
      {0.010169824218750009, 0.043940917968750035, 0.027337500000000025, 0.016040625000000013},
  });
}

// adamw(torch.float32) of the snippet.
TEST(AdamW, MatchesTorchTrajectoryF32) {
  check_adamw_trajectory<float>({
      {-0.9846701622009277, 0.23503068089485168, -0.7448883056640625, 0.49259504675865173,
       -0.5050306916236877, 0.7598391175270081},
      {-0.054106246680021286, 0.06908999383449554, -0.02429000288248062, -0.015081257559359074,
       0.01790124736726284, -0.07547874748706818},
      {0.04366770014166832, 0.032667890191078186, 0.02715265564620495, 0.04814768210053444,
       0.026501957327127457, 0.03375238552689552},
      {-0.23787613213062286, 1.0225505828857422, -0.039228036999702454, -0.9704996943473816},
      {-0.022612499073147774, -0.07081249356269836, 0.10634999722242355, -0.06560000032186508},
      {0.01016982365399599, 0.043940916657447815, 0.02733750082552433, 0.016040625050663948},
  });
}

// 67 elements, so that the vectorised body of the kernels runs (the torch trajectories above
// have 4 and 6 elements and only reach the loop tails): three steps against a scalar
// reference written out in T, in torch's operation order.
template <typename T>
void check_adamw_long() {
  const int64_t n = 67;
  const double lr = 0.01, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1;
  std::vector<double> p0;
  for (int64_t i = 0; i < n; ++i)
    p0.push_back(static_cast<double>(i % 9 - 4) * 0.25);
  Tensor p = make_param<T>(p0, {n});
  AdamW opt({p}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  std::vector<T> ref(p0.begin(), p0.end()), m(n, T(0)), v(n, T(0));
  for (int t = 0; t < 3; ++t) {
    std::vector<double> g;
    for (int64_t i = 0; i < n; ++i)
      g.push_back(test_grad(0, static_cast<int>(i), t));
    p.set_grad(make_tensor<T>(g, {n}));
    opt.step();
    const double bc1 = 1 - std::pow(b1, t + 1), bc2 = 1 - std::pow(b2, t + 1);
    for (int64_t i = 0; i < n; ++i) {
      const T gi = static_cast<T>(g[i]);
      ref[i] = ref[i] * static_cast<T>(1 - lr * wd);
      m[i] = m[i] * static_cast<T>(b1) + static_cast<T>(1 - b1) * gi;
      v[i] = v[i] * static_cast<T>(b2) + static_cast<T>(1 - b2) * gi * gi;
      const T denom = std::sqrt(v[i]) / static_cast<T>(std::sqrt(bc2)) + static_cast<T>(eps);
      ref[i] = ref[i] + static_cast<T>(-(lr / bc1)) * m[i] / denom;
    }
  }
  expect_close(p, std::vector<double>(ref.begin(), ref.end()), kRel<T>, "p");
  expect_close(opt.exp_avg(p), std::vector<double>(m.begin(), m.end()), kRel<T>, "exp_avg");
  expect_close(opt.exp_avg_sq(p), std::vector<double>(v.begin(), v.end()), kRel<T>, "exp_avg_sq");
}

TEST(AdamW, LongParameterMatchesScalarReferenceF64) {
  check_adamw_long<double>();
}
TEST(AdamW, LongParameterMatchesScalarReferenceF32) {
  check_adamw_long<float>();
}

TEST(AdamW, GroupsTakeOptionDefaultsUnlessSet) {
  Tensor a = make_param<double>({1.0, -2.0}, {2});
  Tensor b = make_param<double>({3.0}, {1});
  AdamW opt({{.params = {a}, .lr = 0.5}, {.params = {b}, .weight_decay = 0.25}},
            {.lr = 0.125, .weight_decay = 0.0625});
  EXPECT_EQ(opt.param_groups()[0].lr, 0.5);
  EXPECT_EQ(opt.param_groups()[0].weight_decay, 0.0625);
  EXPECT_EQ(opt.param_groups()[1].lr, 0.125);
  EXPECT_EQ(opt.param_groups()[1].weight_decay, 0.25);

  // One step: p -> p * (1 - lr*wd) - lr * g / (|g| + eps), with each group's lr and wd.
  a.set_grad(make_tensor<double>({2.0, -1.0}, {2}));
  b.set_grad(make_tensor<double>({0.5}, {1}));
  opt.step();
  auto moved = [](double p, double g, double lr, double wd) {
    return p * (1 - lr * wd) - lr * g / (std::abs(g) + 1e-8);
  };
  expect_close(a, {moved(1.0, 2.0, 0.5, 0.0625), moved(-2.0, -1.0, 0.5, 0.0625)}, 1e-14, "a");
  expect_close(b, {moved(3.0, 0.5, 0.125, 0.25)}, 1e-14, "b");
  EXPECT_EQ(opt.parameters().size(), 2u);
}

TEST(AdamW, SkipsParametersWithoutGradient) {
  Tensor a = make_param<float>({1.0, 2.0}, {2});
  Tensor b = make_param<float>({3.0, 4.0}, {2});
  AdamW opt({a, b}, {.lr = 0.1});
  a.set_grad(make_tensor<float>({1.0, 1.0}, {2}));
  opt.step();
  EXPECT_EQ(b.to_vector<float>(), std::vector<float>({3.0f, 4.0f}));  // not even decayed
  EXPECT_FALSE(opt.has_state(b));
  EXPECT_TRUE(opt.has_state(a));
  EXPECT_NE(a.to_vector<float>()[0], 1.0f);
  expect_error([&] { (void)opt.exp_avg(b); }, "no state");
}

TEST(AdamW, LearningRateChangeTakesEffect) {
  Tensor p = make_param<double>({1.0, -1.0}, {2});
  AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.5});
  p.set_grad(make_tensor<double>({0.5, 0.5}, {2}));
  opt.step();
  std::vector<double> after_first = p.to_vector<double>();
  set_lr(opt, 0.0);  // lr 0: neither decay nor update moves the parameter
  opt.step();
  EXPECT_EQ(p.to_vector<double>(), after_first);
  EXPECT_EQ(opt.param_step(p), 2);  // the moments still advanced
}

TEST(AdamW, ZeroGradDropsGradients) {
  auto [w, b] = make_params<double>();
  AdamW opt({w, b});
  set_test_grads<double>(w, b, 0, false);
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  std::vector<double> before = w.to_vector<double>();
  opt.step();  // nothing to update
  EXPECT_EQ(w.to_vector<double>(), before);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_FALSE(opt.has_state(w));
}

TEST(AdamW, StateDictRoundTrip) {
  auto [w, b] = make_params<double>();
  AdamW opt({{.params = {w}}, {.params = {b}, .weight_decay = 0.0}}, {.lr = 0.01});
  for (int t = 0; t < 2; ++t) {
    set_test_grads<double>(w, b, t, /*skip_b=*/t == 0);
    opt.step();
  }
  std::map<std::string, Tensor> state = opt.state_dict();
  for (const char* key :
       {"step_count", "param_groups.0.lr", "param_groups.1.weight_decay", "state.0.0.exp_avg",
        "state.0.0.exp_avg_sq", "state.0.0.step", "state.1.0.exp_avg"}) {
    EXPECT_EQ(state.count(key), 1u) << key;
  }
  EXPECT_EQ(state.at("state.0.0.step").to_vector<int64_t>(), std::vector<int64_t>({2}));
  EXPECT_EQ(state.at("state.1.0.step").to_vector<int64_t>(), std::vector<int64_t>({1}));

  // A second optimizer over copies of the parameters continues identically.
  Tensor w2 = w.detach().clone().set_requires_grad(true);
  Tensor b2 = b.detach().clone().set_requires_grad(true);
  AdamW resumed({{.params = {w2}}, {.params = {b2}}}, {.lr = 0.5});
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.step_count(), 2);
  EXPECT_EQ(resumed.param_groups()[0].lr, 0.01);
  EXPECT_EQ(resumed.param_groups()[1].weight_decay, 0.0);
  set_test_grads<double>(w, b, 2, false);
  set_test_grads<double>(w2, b2, 2, false);
  opt.step();
  resumed.step();
  EXPECT_EQ(w2.to_vector<double>(), w.to_vector<double>());
  EXPECT_EQ(b2.to_vector<double>(), b.to_vector<double>());
  EXPECT_EQ(resumed.param_step(b2), 2);

  AdamW fresh({w2, b2});
  expect_error([&] { fresh.load_state_dict({{"bogus", Tensor::zeros({1})}}); }, "unknown key");
  expect_error(
      [&] {
        fresh.load_state_dict({{"state.0.0.exp_avg", Tensor::zeros({3}, DType::F64)}});
      },
      "exp_avg");
  expect_error(
      [&] {
        fresh.load_state_dict({{"state.0.9.exp_avg", Tensor::zeros({1})}});
      },
      "does not have");
}

TEST(AdamW, RejectsInvalidConfigurations) {
  Tensor p = make_param<float>({1.0}, {1});
  expect_error([&] { AdamW({p}, {.lr = -1e-3}); }, "invalid lr");
  expect_error([&] { AdamW({p}, {.beta1 = 1.0}); }, "beta1");
  expect_error([&] { AdamW({p}, {.beta2 = -0.1}); }, "beta2");
  expect_error([&] { AdamW({p}, {.eps = -1.0}); }, "eps");
  expect_error([&] { AdamW({p}, {.weight_decay = -0.1}); }, "weight_decay");
  expect_error([&] { AdamW(std::vector<ParamGroup>{{.params = {p}, .lr = -0.5}}); },
               "learning rate");
  expect_error([&] { AdamW(std::vector<Tensor>{}); }, "empty parameter list");
  expect_error([&] { AdamW({p, p}); }, "more than once");
  expect_error([&] { AdamW({Tensor()}); }, "undefined");

  // Unsupported dtype and layout: the message names the parameter and what is supported. A
  // 16-bit parameter is refused at the first step, not at construction (a sharded strategy
  // with 16-bit weights hands the optimizer f32 masters of it).
  Tensor half = Tensor::zeros({2}, DType::BF16).set_requires_grad(true);
  AdamW holds_half({p, half});
  expect_error([&] { holds_half.step(); }, "parameter 1 of group 0");
  expect_error([&] { holds_half.step(); }, "contiguous f32 or f64 tensors on the CPU");
  Tensor strided = Tensor::zeros({2, 3}).transpose(0, 1);
  expect_error([&] { AdamW({strided}); }, "contiguous f32 or f64");
  Tensor leaf = make_param<float>({1.0, 2.0}, {2});
  Tensor not_leaf = leaf * 2.0;
  expect_error([&] { AdamW({not_leaf}); }, "leaf");
  // CUDA tensors cannot be created in a CPU-only build; step() dispatches on the device.

  // Gradient with another dtype than its parameter; lr made negative after construction.
  AdamW opt({p});
  p.set_grad(Tensor::zeros({1}, DType::F64));
  expect_error([&] { opt.step(); }, "has a gradient");
  p.set_grad(Tensor::zeros({1}));
  opt.param_groups()[0].lr = -1.0;
  expect_error([&] { opt.step(); }, "learning rate");
}

TEST(AdamW, AcceptsNonContiguousGradient) {
  Tensor p = make_param<double>({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {3, 2});
  Tensor q = make_param<double>({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {3, 2});
  Tensor g = make_tensor<double>({0.1, -0.2, 0.3, -0.4, 0.5, -0.6}, {2, 3});
  p.set_grad(g.transpose(0, 1));
  q.set_grad(g.transpose(0, 1).contiguous());
  AdamW opt({p, q}, {.lr = 0.1});
  opt.step();
  EXPECT_EQ(p.to_vector<double>(), q.to_vector<double>());
}

TEST(AdamW, MinimisesQuadraticThroughAutograd) {
  Tensor target = make_tensor<float>({1.0, -2.0, 0.5}, {3});
  Tensor w = make_param<float>({0.0, 0.0, 0.0}, {3});
  AdamW opt({w}, {.lr = 0.05, .weight_decay = 0.0});
  for (int i = 0; i < 300; ++i) {
    opt.zero_grad();
    Tensor d = w - target;
    Tensor loss = sum(d * d);
    loss.backward();
    opt.step();
  }
  expect_close(w, {1.0, -2.0, 0.5}, 1e-2, "w");
}

// --- SGD -----------------------------------------------------------------------------------

TEST(SGD, PlainStepMatchesClosedForm) {
  Tensor p = make_param<double>({1.0, -2.0, 0.25}, {3});
  p.set_grad(make_tensor<double>({0.5, -0.125, 3.0}, {3}));
  SGD opt({p}, {.lr = 0.1});
  opt.step();
  expect_close(p, {1.0 - 0.1 * 0.5, -2.0 + 0.1 * 0.125, 0.25 - 0.1 * 3.0}, 1e-15, "p");
  EXPECT_FALSE(opt.has_momentum_buffer(p));  // momentum 0 keeps no state
}

template <typename T>
void check_sgd_trajectory(const SGDOptions& options,
                          const std::vector<std::vector<double>>& expected) {
  auto [w, b] = make_params<T>();
  SGD opt({w, b}, options);
  for (int t = 0; t < 4; ++t) {
    set_test_grads<T>(w, b, t, /*skip_b=*/t == 1);  // b's buffer must survive the gap
    opt.step();
  }
  expect_close(w, expected[0], kRel<T>, "w");
  expect_close(opt.momentum_buffer(w), expected[1], kRel<T>, "w momentum_buffer");
  expect_close(b, expected[2], kRel<T>, "b");
  expect_close(opt.momentum_buffer(b), expected[3], kRel<T>, "b momentum_buffer");
}

const SGDOptions kDampened{.lr = 0.05, .momentum = 0.9, .dampening = 0.1, .weight_decay = 0.01};
const SGDOptions kNesterov{.lr = 0.1, .momentum = 0.8, .weight_decay = 0.02, .nesterov = true};

// sgd(torch.float64, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01) of the snippet.
TEST(SGD, MatchesTorchMomentumDampeningWeightDecayF64) {
  check_sgd_trajectory<double>(
      kDampened,
      {
          {-0.8911339053612057, 0.16188727439815045, -0.7393565390234234, 0.4193650970156204,
           -0.5319195164356407, 0.8072944270768255},
          {-0.11656291418838563, 0.340890373405741, -0.1596119048877853, 0.5345253821125913,
           -0.07835402058718496, -0.5076638546177615},
          {-0.26895829433406254, 1.048790157476875, -0.0017987212812500004, -0.9837273048675},
          {0.06110851168124999, 0.07092010046250002, -0.101413074375, -0.27257090265000006},
      });
}

// sgd(torch.float32, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01).
TEST(SGD, MatchesTorchMomentumDampeningWeightDecayF32) {
  check_sgd_trajectory<float>(
      kDampened,
      {
          {-0.8911338448524475, 0.1618872880935669, -0.739356517791748, 0.4193650782108307,
           -0.5319194793701172, 0.8072943687438965},
          {-0.1165628731250763, 0.3408903181552887, -0.15961186587810516, 0.5345253348350525,
           -0.07835400104522705, -0.5076638460159302},
          {-0.26895830035209656, 1.0487902164459229, -0.0017987227765843272, -0.9837272763252258},
          {0.06110852211713791, 0.07092012465000153, -0.1014130562543869, -0.2725709080696106},
      });
}

// sgd(torch.float64, lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.02).
TEST(SGD, MatchesTorchNesterovF64) {
  check_sgd_trajectory<double>(
      kNesterov, {
                     {-0.8180312758263616, 0.06939195816391036, -0.7193985992526913,
                      0.32401224233758075, -0.5336569226790209, 0.8803182316038911},
                     {0.07045662081311993, 0.2361343964227201, -0.19168054059616002,
                      0.47964941501344, -0.17386770200543994, -0.46989625024383996},
                     {-0.294330320736, 1.048648507344, 0.017895616799999996, -0.943978666144},
                     {0.03157511520000006, 0.25296495920000006, -0.14058676, -0.30843629920000004},
                 });
}

// sgd(torch.float32, lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.02).
TEST(SGD, MatchesTorchNesterovF32) {
  check_sgd_trajectory<float>(
      kNesterov,
      {
          {-0.8180312514305115, 0.06939195096492767, -0.7193986177444458, 0.32401221990585327,
           -0.533656895160675, 0.880318284034729},
          {0.07045665383338928, 0.23613440990447998, -0.19168052077293396, 0.47964945435523987,
           -0.17386771738529205, -0.4698962867259979},
          {-0.29433032870292664, 1.048648476600647, 0.017895616590976715, -0.9439786672592163},
          {0.031575173139572144, 0.25296491384506226, -0.1405867487192154, -0.3084362745285034},
      });
}

// 67 elements (vectorised body, see check_adamw_long): Nesterov SGD with weight decay for three
// steps against a scalar reference in T.
template <typename T>
void check_sgd_long() {
  const int64_t n = 67;
  const double lr = 0.1, mom = 0.8, wd = 0.02;
  std::vector<double> p0;
  for (int64_t i = 0; i < n; ++i)
    p0.push_back(static_cast<double>(i % 9 - 4) * 0.25);
  Tensor p = make_param<T>(p0, {n});
  SGD opt({p}, {.lr = lr, .momentum = mom, .weight_decay = wd, .nesterov = true});
  std::vector<T> ref(p0.begin(), p0.end()), buf(n, T(0));
  for (int t = 0; t < 3; ++t) {
    std::vector<double> g;
    for (int64_t i = 0; i < n; ++i)
      g.push_back(test_grad(0, static_cast<int>(i), t));
    p.set_grad(make_tensor<T>(g, {n}));
    opt.step();
    for (int64_t i = 0; i < n; ++i) {
      T d = static_cast<T>(g[i]) + static_cast<T>(wd) * ref[i];
      buf[i] = t == 0 ? d : buf[i] * static_cast<T>(mom) + static_cast<T>(1.0) * d;
      d = d + static_cast<T>(mom) * buf[i];
      ref[i] = ref[i] + static_cast<T>(-lr) * d;
    }
  }
  expect_close(p, std::vector<double>(ref.begin(), ref.end()), kRel<T>, "p");
  expect_close(opt.momentum_buffer(p), std::vector<double>(buf.begin(), buf.end()), kRel<T>,
               "momentum_buffer");
}

TEST(SGD, LongParameterMatchesScalarReferenceF64) {
  check_sgd_long<double>();
}
TEST(SGD, LongParameterMatchesScalarReferenceF32) {
  check_sgd_long<float>();
}

TEST(SGD, GroupsWithDifferentLearningRatesAndWeightDecay) {
  Tensor a = make_param<double>({1.0, 2.0}, {2});
  Tensor b = make_param<double>({1.0, 2.0}, {2});
  SGD opt({{.params = {a}, .lr = 0.5}, {.params = {b}, .weight_decay = 0.25}}, {.lr = 0.125});
  a.set_grad(make_tensor<double>({1.0, -1.0}, {2}));
  b.set_grad(make_tensor<double>({1.0, -1.0}, {2}));
  opt.step();
  expect_close(a, {1.0 - 0.5 * 1.0, 2.0 - 0.5 * -1.0}, 1e-15, "a");
  expect_close(b, {1.0 - 0.125 * (1.0 + 0.25 * 1.0), 2.0 - 0.125 * (-1.0 + 0.25 * 2.0)}, 1e-15,
               "b");
}

TEST(SGD, StateDictRoundTrip) {
  auto [w, b] = make_params<float>();
  SGD opt({w, b}, kNesterov);
  set_test_grads<float>(w, b, 0, /*skip_b=*/true);
  opt.step();
  std::map<std::string, Tensor> state = opt.state_dict();
  EXPECT_EQ(state.count("state.0.0.momentum_buffer"), 1u);
  EXPECT_EQ(state.count("state.0.1.momentum_buffer"), 0u);  // b has no buffer yet

  Tensor w2 = w.detach().clone().set_requires_grad(true);
  Tensor b2 = b.detach().clone().set_requires_grad(true);
  SGD resumed({w2, b2}, kNesterov);
  resumed.load_state_dict(state);
  for (int t = 1; t < 3; ++t) {
    set_test_grads<float>(w, b, t, false);
    set_test_grads<float>(w2, b2, t, false);
    opt.step();
    resumed.step();
  }
  EXPECT_EQ(w2.to_vector<float>(), w.to_vector<float>());
  EXPECT_EQ(b2.to_vector<float>(), b.to_vector<float>());
  EXPECT_EQ(resumed.step_count(), 3);
}

TEST(SGD, RejectsInvalidConfigurations) {
  Tensor p = make_param<double>({1.0}, {1});
  expect_error([&] { SGD({p}, {.lr = 0.1, .nesterov = true}); }, "Nesterov");
  expect_error([&] { SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}); },
               "Nesterov");
  expect_error([&] { SGD({p}, {.lr = -0.1}); }, "invalid lr");
  expect_error([&] { SGD({p}, {.lr = 0.1, .momentum = -0.5}); }, "momentum");
  expect_error([&] { SGD({p}, {.lr = 0.1, .weight_decay = -1.0}); }, "weight_decay");
  expect_error([&] { SGD({p}); }, "no learning rate");
  Tensor ints = Tensor::zeros({3}, DType::I32);
  expect_error([&] { SGD({ints}, {.lr = 0.1}); }, "parameter 0 of group 0");
  // Every group sets its own lr: no optimizer-wide default needed, as in torch.
  SGD ok(std::vector<ParamGroup>{{.params = {p}, .lr = 0.1}});
  EXPECT_EQ(ok.param_groups()[0].lr, 0.1);
}

TEST(SGD, MinimisesQuadraticThroughAutograd) {
  Tensor target = make_tensor<double>({1.0, -2.0, 0.5}, {3});
  Tensor w = make_param<double>({0.0, 0.0, 0.0}, {3});
  SGD opt({w}, {.lr = 0.1, .momentum = 0.5});
  for (int i = 0; i < 100; ++i) {
    opt.zero_grad();
    Tensor d = w - target;
    sum(d * d).backward();
    opt.step();
  }
  expect_close(w, {1.0, -2.0, 0.5}, 1e-6, "w");
}

// --- clip_grad_norm ----------------------------------------------------------------------

// Two parameters with gradients {3, 4} and {12}: 2-norm 13, inf-norm 12, 1-norm 19.
std::vector<Tensor> clip_params() {
  Tensor a = make_param<double>({0.0, 0.0}, {2});
  Tensor b = make_param<double>({0.0}, {1});
  Tensor c = make_param<double>({0.0}, {1});  // no gradient: skipped
  a.set_grad(make_tensor<double>({3.0, -4.0}, {2}));
  b.set_grad(make_tensor<double>({12.0}, {1}));
  return {a, b, c};
}

TEST(ClipGradNorm, BelowThresholdLeavesGradients) {
  std::vector<Tensor> params = clip_params();
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 20.0), 13.0);
  EXPECT_EQ(params[0].grad().to_vector<double>(), std::vector<double>({3.0, -4.0}));
  EXPECT_EQ(params[1].grad().to_vector<double>(), std::vector<double>({12.0}));
  EXPECT_FALSE(params[2].grad().defined());
}

TEST(ClipGradNorm, AboveThresholdScalesToMaxNorm) {
  std::vector<Tensor> params = clip_params();
  EXPECT_DOUBLE_EQ(clip_grad_norm(params, 1.0), 13.0);
  double coef = 1.0 / (13.0 + 1e-6);
  expect_close(params[0].grad(), {3.0 * coef, -4.0 * coef}, 1e-15, "a");
  expect_close(params[1].grad(), {12.0 * coef}, 1e-15, "b");
  EXPECT_NEAR(grad_norm(params), 1.0, 1e-6);
}

TEST(ClipGradNorm, InfinityNorm) {
  std::vector<Tensor> params = clip_params();
  EXPECT_EQ(clip_grad_norm(params, 6.0, kInfNorm), 12.0);
  double coef = 6.0 / (12.0 + 1e-6);
  expect_close(params[0].grad(), {3.0 * coef, -4.0 * coef}, 1e-15, "a");
  expect_close(params[1].grad(), {12.0 * coef}, 1e-15, "b");
}

TEST(ClipGradNorm, OtherNormTypes) {
  std::vector<Tensor> params = clip_params();
  EXPECT_DOUBLE_EQ(grad_norm(params, 1.0), 19.0);
  // torch: the 3-norm of the per-parameter 3-norms, which equals the 3-norm of all values.
  double three = std::cbrt(27.0 + 64.0 + 1728.0);
  EXPECT_NEAR(grad_norm(params, 3.0), three, 1e-13);
  EXPECT_EQ(params[0].grad().to_vector<double>(), std::vector<double>({3.0, -4.0}));
  expect_error([&] { grad_norm(params, 0.0); }, "norm_type");
  expect_error([&] { grad_norm(params, -2.0); }, "norm_type");
}

TEST(ClipGradNorm, F32GradientsLongerThanOneVector) {
  // 37 elements: exercises the vector body and the tail of the reductions.
  std::vector<double> values;
  double sum_sq = 0.0;
  for (int i = 0; i < 37; ++i) {
    values.push_back((i % 7 - 3) * 0.5);
    sum_sq += values.back() * values.back();
  }
  Tensor p = make_param<float>(values, {37});
  p.set_grad(make_tensor<float>(values, {37}));
  double norm = clip_grad_norm({p}, 1.0);
  EXPECT_NEAR(norm, std::sqrt(sum_sq), 1e-12);
  std::vector<double> clipped;
  for (double v : values)
    clipped.push_back(v / (std::sqrt(sum_sq) + 1e-6));
  expect_close(p.grad(), clipped, 1e-6, "grad");
  EXPECT_NEAR(grad_norm({p}, kInfNorm), 1.5 / (std::sqrt(sum_sq) + 1e-6), 1e-7);
}

TEST(ClipGradNorm, NoGradientsGiveZero) {
  Tensor p = make_param<double>({1.0}, {1});
  EXPECT_EQ(clip_grad_norm({p}, 1.0), 0.0);
  EXPECT_EQ(clip_grad_norm({}, 1.0), 0.0);
}

TEST(ClipGradNorm, NonFiniteNormLeavesGradientsUntouched) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<Tensor> params = clip_params();
  params[0].set_grad(make_tensor<double>({inf, 1.0}, {2}));
  EXPECT_EQ(clip_grad_norm(params, 1.0), inf);
  EXPECT_EQ(params[0].grad().to_vector<double>(), std::vector<double>({inf, 1.0}));
  EXPECT_EQ(params[1].grad().to_vector<double>(), std::vector<double>({12.0}));
  EXPECT_EQ(clip_grad_norm(params, 1.0, kInfNorm), inf);

  params[0].set_grad(make_tensor<double>({nan, 1.0}, {2}));
  EXPECT_TRUE(std::isnan(clip_grad_norm(params, 1.0)));
  EXPECT_TRUE(std::isnan(clip_grad_norm(params, 1.0, kInfNorm)));
  EXPECT_EQ(params[1].grad().to_vector<double>(), std::vector<double>({12.0}));
  expect_error([&] { clip_grad_norm(params, 1.0, 2.0, /*error_if_nonfinite=*/true); },
               "non-finite");
}

TEST(ClipGradNorm, RejectsUnsupportedGradients) {
  Tensor p = Tensor::zeros({2, 3}, DType::F32).set_requires_grad(true);
  Tensor q = Tensor::zeros({3, 2}, DType::F32).set_requires_grad(true);
  q.set_grad(Tensor::ones({2, 3}).transpose(0, 1));
  expect_error([&] { clip_grad_norm({p, q}, 1.0); }, "gradient of parameter 1");
}

// --- learning-rate schedules -----------------------------------------------------------------

TEST(LrSchedule, Constant) {
  ConstantSchedule schedule(3e-4);
  EXPECT_EQ(schedule.lr_at(0), 3e-4);
  EXPECT_EQ(schedule.lr_at(123456), 3e-4);
  expect_error([&] { (void)schedule.lr_at(-1); }, "negative");
  expect_error([] { ConstantSchedule(-1.0); }, "invalid lr");
}

TEST(LrSchedule, WarmupCosine) {
  const double max_lr = 6e-4, min_lr = 6e-5;
  WarmupCosineSchedule schedule(max_lr, /*warmup_steps=*/10, /*total_steps=*/110, min_lr);
  EXPECT_DOUBLE_EQ(schedule.lr_at(0), max_lr / 10);  // warmup: max_lr * (step + 1) / warmup
  EXPECT_DOUBLE_EQ(schedule.lr_at(4), max_lr * 5 / 10);
  EXPECT_DOUBLE_EQ(schedule.lr_at(9), max_lr);   // last warmup step reaches the peak
  EXPECT_DOUBLE_EQ(schedule.lr_at(10), max_lr);  // cosine starts at the peak
  EXPECT_DOUBLE_EQ(schedule.lr_at(35),
                   min_lr + 0.5 * (1 + std::cos(std::numbers::pi / 4)) * (max_lr - min_lr));
  EXPECT_DOUBLE_EQ(schedule.lr_at(60), (max_lr + min_lr) / 2);  // midpoint of the decay
  EXPECT_GT(schedule.lr_at(109), min_lr);  // last decay step, just above min_lr
  EXPECT_LT(schedule.lr_at(109), min_lr + 1e-3 * (max_lr - min_lr));
  EXPECT_EQ(schedule.lr_at(110), min_lr);   // end
  EXPECT_EQ(schedule.lr_at(1000), min_lr);  // beyond the end
  for (int64_t s = 10; s < 111; ++s)
    EXPECT_LE(schedule.lr_at(s), schedule.lr_at(s - 1)) << s;
}

TEST(LrSchedule, WarmupCosineEdgeCases) {
  WarmupCosineSchedule no_warmup(1.0, 0, 4);
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(0), 1.0);
  EXPECT_DOUBLE_EQ(no_warmup.lr_at(2), 0.5);
  EXPECT_EQ(no_warmup.lr_at(4), 0.0);
  WarmupCosineSchedule all_warmup(1.0, 4, 4, 0.25);
  EXPECT_DOUBLE_EQ(all_warmup.lr_at(3), 1.0);
  EXPECT_EQ(all_warmup.lr_at(4), 0.25);
  expect_error([] { WarmupCosineSchedule(1.0, 5, 4); }, "warmup_steps <= total_steps");
  expect_error([] { WarmupCosineSchedule(1.0, -1, 4); }, "warmup_steps");
  expect_error([] { WarmupCosineSchedule(1.0, 0, 4, 2.0); }, "min_lr <= max_lr");
  expect_error([&] { (void)no_warmup.lr_at(-3); }, "negative");
}

TEST(LrSchedule, ApplySetsEveryGroup) {
  Tensor a = make_param<double>({1.0}, {1});
  Tensor b = make_param<double>({1.0}, {1});
  AdamW opt({{.params = {a}, .lr = 0.1}, {.params = {b}, .lr = 0.2}});
  WarmupCosineSchedule schedule(1e-3, 10, 100);
  schedule.apply(opt, 4);
  EXPECT_DOUBLE_EQ(opt.param_groups()[0].lr, 5e-4);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].lr, 5e-4);
}

}  // namespace
}  // namespace loom::optim
