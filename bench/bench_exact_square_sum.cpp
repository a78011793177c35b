// The exact sum of squares behind the gradient norm (Note [Exact sums of squares]), against
// a long double sum.

#include "bench/roofline.h"
#include "bench/validate.h"
#include "kernels/cpu/exact_square_sum.h"
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace loom::bench {
namespace {

void BM_ExactSquareSum(benchmark::State& state) {
  const int64_t n = state.range(0);
  Generator gen(7);
  Tensor g = Tensor::empty({n});
  normal_(g, 0, 1e-3, gen);  // a gradient's magnitudes: neighbours mostly share an exponent
  const float* x = g.data<float>();
  long double want = 0;
  for (int64_t i = 0; i < n; ++i)
    want += static_cast<long double>(x[i]) * x[i];
  kernels::cpu::ExactSquareSum check;
  check.add_squares(x, n);
  const double got = check.value();
  if (!validated(state, compare(std::vector<double>{got / static_cast<double>(want)},
                                std::vector<double>{1.0}),
                 1e-12)) {
    return;
  }
  for (auto _ : state) {
    kernels::cpu::ExactSquareSum sum;
    sum.add_squares(x, n);
    benchmark::DoNotOptimize(sum.value());
  }
  state.counters["GB/s"] =
      benchmark::Counter(4.0 * double(n) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_working_set(state, 4.0 * double(n));
}

// From a block's bias to GPT-2 small's 124M parameters.
BENCHMARK(BM_ExactSquareSum)
    ->ArgNames({"n"})
    ->Arg(1 << 16)
    ->Arg(1 << 20)
    ->Arg(124 << 20)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace loom::bench
