// kernels/cuda/optimizer.cu under the emulator against kernels/cpu/optimizer_steps:
// multi-tensor AdamW over many odd-sized tensors (several launches' worth of chunks), with
// and without a device gradient scale, and SGD in every option combination.
//
// Tolerance: the kernels round every operation (__fadd_rn and friends), as the CPU source
// does, but the CPU kernels are built with FMA contraction (the release flags), so an element
// may differ by an ulp or two (docs/cuda.md); f64 and everything within one step agree to
// 2 ulp here.

#include "kernels/cuda/optimizer.h"

#include "emulation_test_util.h"
#include "kernels/cpu/optimizer_steps.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

template <typename T>
constexpr double ulps2() {
  return std::is_same_v<T, double> ? 5e-16 : 2.5e-7;
}

template <typename T>
void check_adamw(bool with_scale) {
  std::mt19937_64 rng(59);
  std::uniform_int_distribution<int64_t> size(1, 3000);
  const int count = 64;
  std::vector<std::vector<T>> params, grads, ms, vs;
  for (int i = 0; i < count; ++i) {
    const auto n = static_cast<size_t>(i == 0 ? 70000 : size(rng));  // one tensor of many chunks
    params.push_back(random_values<T>(n, rng));
    grads.push_back(random_values<T>(n, rng, -0.1, 0.1));
    ms.push_back(random_values<T>(n, rng, -0.01, 0.01));
    vs.push_back(random_values<T>(n, rng, 0.0, 1e-4));
  }
  const float scale = 0.25f;
  for (int64_t step : {1, 7}) {
    gpu::AdamWArgs g;
    g.lr = 1e-2;
    g.weight_decay = 0.1;
    g.step = step;
    cpu::AdamWStepArgs c;
    c.lr = g.lr;
    c.weight_decay = g.weight_decay;
    c.step = step;
    for_each_schedule([&] {
      auto p = params, m = ms, v = vs;
      std::vector<gpu::AdamWTensor> table;
      for (int i = 0; i < count; ++i) {
        table.push_back({p[static_cast<size_t>(i)].data(), grads[static_cast<size_t>(i)].data(),
                         m[static_cast<size_t>(i)].data(), v[static_cast<size_t>(i)].data(),
                         static_cast<int64_t>(p[static_cast<size_t>(i)].size())});
      }
      gpu::multi_tensor_adamw(dtype_of<T>(), table.data(), count, g,
                              with_scale ? &scale : nullptr, nullptr);
      for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
        auto pw = widen_all(params[i]), gw = widen_all(grads[i]), mw = widen_all(ms[i]),
             vw = widen_all(vs[i]);
        if (with_scale)
          for (auto& e : gw) e *= scale;
        cpu::adamw_step(pw.data(), gw.data(), mw.data(), vw.data(),
                        static_cast<int64_t>(pw.size()), c);
        const double tol = std::is_same_v<T, __nv_bfloat16> ? tolerance<T>() : ulps2<T>();
        ASSERT_LE(max_relative_error(p[i], pw), tol) << "tensor " << i << " step " << step;
        ASSERT_LE(max_relative_error(m[i], mw, 1e-3), 4 * tol) << "tensor " << i;
        ASSERT_LE(max_relative_error(v[i], vw, 1e-6), 4 * tol) << "tensor " << i;
      }
    });
  }
}

TEST(EmulatedOptimizer, MultiTensorAdamWF32) { check_adamw<float>(false); }
TEST(EmulatedOptimizer, MultiTensorAdamWWithDeviceGradScaleF32) { check_adamw<float>(true); }
TEST(EmulatedOptimizer, MultiTensorAdamWF64) { check_adamw<double>(false); }
TEST(EmulatedOptimizer, MultiTensorAdamWBf16) { check_adamw<__nv_bfloat16>(false); }

template <typename T>
void check_sgd_options() {
  std::mt19937_64 rng(61);
  int combinations = 0;
  for (double momentum : {0.0, 0.9})
    for (double dampening : {0.0, 0.1})
      for (double weight_decay : {0.0, 0.01})
        for (bool nesterov : {false, true})
          for (bool first_step : {false, true}) {
            if (nesterov && (momentum == 0.0 || dampening != 0.0)) continue;  // torch refuses
            SCOPED_TRACE("momentum " + std::to_string(momentum) + " dampening " +
                         std::to_string(dampening) + " wd " + std::to_string(weight_decay) +
                         " nesterov " + std::to_string(nesterov) + " first " +
                         std::to_string(first_step));
            const int64_t n = 1029;
            const auto p0 = random_values<T>(n, rng), g0 = random_values<T>(n, rng),
                       b0 = random_values<T>(n, rng);
            gpu::SGDArgs g{0.05, momentum, dampening, weight_decay, nesterov, first_step};
            cpu::SGDStepArgs c{0.05, momentum, dampening, weight_decay, nesterov, first_step};
            auto p = p0, b = b0;
            gpu::sgd_step(dtype_of<T>(), p.data(), g0.data(), b.data(), n, g, nullptr);
            auto pw = widen_all(p0), gw = widen_all(g0), bw = widen_all(b0);
            cpu::sgd_step(pw.data(), gw.data(), bw.data(), n, c);
            EXPECT_LE(max_relative_error(p, pw), ulps2<T>());
            EXPECT_LE(max_relative_error(b, bw), ulps2<T>());
            ++combinations;
          }
  EXPECT_EQ(combinations, 20);
}

TEST(EmulatedOptimizer, SgdInEveryOptionCombinationF32) {
  for_each_schedule([] { check_sgd_options<float>(); });
}
TEST(EmulatedOptimizer, SgdInEveryOptionCombinationF64) { check_sgd_options<double>(); }

}  // namespace
}  // namespace loom::cuda_emulation::testing
