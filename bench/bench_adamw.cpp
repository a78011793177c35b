// One AdamW step over a flat parameter, against the scalar formula in f64.

#include "bench/roofline.h"
#include "bench/validate.h"
#include "optim/adamw.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::bench {
namespace {

void BM_AdamWStep(benchmark::State& state) {
  int64_t n = state.range(0);
  Generator gen(5);
  Tensor p = Tensor::empty({n}), g = Tensor::empty({n});
  normal_(p, 0, 1, gen);
  normal_(g, 0, 1, gen);
  p.set_requires_grad(true);
  p.set_grad(g);
  const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  std::vector<float> p0 = p.to_vector<float>(), g0 = g.to_vector<float>();
  optim::AdamW opt(std::vector<Tensor>{p},
                   {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  opt.step();
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) {
    double m = (1 - b1) * g0[i], v = (1 - b2) * double(g0[i]) * g0[i];
    double denom = std::sqrt(v) / std::sqrt(1 - b2) + eps;
    want[i] = p0[i] * (1 - lr * wd) - lr / (1 - b1) * m / denom;
  }
  if (!validated(state, compare(p.to_vector<float>(), want), 1e-6)) return;
  for (auto _ : state)
    opt.step();
  // Bytes: read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq.
  state.counters["GB/s"] =
      benchmark::Counter(7.0 * n * 4 * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_working_set(state, 4.0 * n * 4);
}

BENCHMARK(BM_AdamWStep)
    ->ArgNames({"n"})
    ->Arg(1 << 16)
    ->Arg(1 << 20)
    ->Arg(1 << 23)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace loom::bench
