// kernels/cuda/optimizer.cu under the emulator against kernels/cpu/optimizer_steps:
// multi-tensor AdamW over many odd-sized tensors (several launches' worth of chunks), with
// and without a device gradient scale, with its scalars from device memory, and SGD in every
// option combination.
//
// Tolerance: the kernels round every operation (__fadd_rn and friends), as the CPU source
// does, but the CPU kernels are built with FMA contraction (the release flags), so an element
// may differ by an ulp or two (docs/cuda.md); f64 and everything within one step agree to
// 2 ulp here.

#include "kernels/cuda/optimizer.h"

#include <utility>
#include <vector>

#include "emulation_test_util.h"
#include "kernels/cpu/optimizer_steps.h"
#include "kernels/cuda/chunk_plan.cuh"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

template <typename T>
constexpr double ulps2() {
  return std::is_same_v<T, double> ? 5e-16 : 2.5e-7;
}

// with_scale: a device gradient scale; device_scalars: the step's scalars read from device
// memory (write_adamw_scalars), the arguments passed by value being another step's.
template <typename T>
void check_adamw(bool with_scale, bool device_scalars = false) {
  std::mt19937_64 rng(59);
  std::uniform_int_distribution<int64_t> size(1, 600);
  const int count = 272;  // more than one launch table's 256 tensors
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
      if (device_scalars) {
        std::vector<unsigned char> scalars(gpu::adamw_scalars_bytes(dtype_of<T>()));
        gpu::write_adamw_scalars(dtype_of<T>(), g, scalars.data());
        gpu::AdamWArgs stale = g;  // what a captured launch was issued with
        stale.lr = 0.5;
        stale.step = step + 3;
        gpu::multi_tensor_adamw(dtype_of<T>(), table.data(), count, stale,
                                with_scale ? &scale : nullptr, nullptr, scalars.data());
      } else {
        gpu::multi_tensor_adamw(dtype_of<T>(), table.data(), count, g,
                                with_scale ? &scale : nullptr, nullptr);
      }
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
TEST(EmulatedOptimizer, MultiTensorAdamWWithDeviceScalarsF32) { check_adamw<float>(true, true); }
TEST(EmulatedOptimizer, MultiTensorAdamWWithDeviceScalarsF64) { check_adamw<double>(false, true); }
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

// Note [Multi-tensor launches]'s planner alone, on sizes no emulated kernel could take: the
// blocks of all launches visit every chunk of every non-empty tensor once, in order; no
// launch goes over either limit; a tensor cut by the block limit goes on as the next table's
// first slot. Each launch is a list of (tensor, chunk) pairs.
using PlannedLaunch = std::vector<std::pair<int, int32_t>>;
std::vector<PlannedLaunch> plan_launches(const std::vector<int64_t>& sizes, int64_t chunk) {
  struct PlanTable {
    gpu::ChunkPlan plan;
  };
  auto table = std::make_unique<PlanTable>();
  const gpu::ChunkPlan* plan = &table->plan;
  int slot_tensor[gpu::kMaxChunkTensors];
  std::vector<PlannedLaunch> launches;
  gpu::for_each_chunk_plan(
      *table, static_cast<int>(sizes.size()), chunk,
      [&](int k) { return sizes[static_cast<size_t>(k)]; },
      [&](int slot, int k) { slot_tensor[slot] = k; },
      [&](int blocks) {
        EXPECT_LE(blocks, gpu::kMaxChunkBlocks);
        PlannedLaunch launch;
        for (int b = 0; b < blocks; ++b)
          launch.emplace_back(slot_tensor[plan->block_tensor[b]], plan->block_chunk[b]);
        launches.push_back(std::move(launch));
      });
  return launches;
}

void expect_every_chunk_once_in_order(const std::vector<int64_t>& sizes, int64_t chunk,
                                      const std::vector<PlannedLaunch>& launches) {
  PlannedLaunch want, got;
  for (size_t k = 0; k < sizes.size(); ++k)
    for (int64_t c = 0; c * chunk < sizes[k]; ++c)
      want.emplace_back(static_cast<int>(k), static_cast<int32_t>(c));
  for (const PlannedLaunch& launch : launches) got.insert(got.end(), launch.begin(), launch.end());
  EXPECT_EQ(got, want);
}

TEST(ChunkPlan, CutsAtTheTensorLimitAndCarriesATensorOverTheBlockLimit) {
  constexpr int64_t kChunk = 1000;
  // 300 one-chunk tensors (an empty one among them), then one of kMaxChunkBlocks + 5 chunks.
  std::vector<int64_t> sizes(300, 7);
  sizes[10] = 0;
  sizes.push_back(kChunk * (gpu::kMaxChunkBlocks + 5) - 1);
  const std::vector<PlannedLaunch> launches = plan_launches(sizes, kChunk);
  expect_every_chunk_once_in_order(sizes, kChunk, launches);
  // The first table fills its 256 slots (tensors 0-256, the empty one skipped); the second
  // takes the other 43 small tensors and the big one's first chunks up to the block limit;
  // the third the big one's rest.
  ASSERT_EQ(launches.size(), 3u);
  EXPECT_EQ(launches[0].size(), static_cast<size_t>(gpu::kMaxChunkTensors));
  EXPECT_EQ(launches[0].back().first, gpu::kMaxChunkTensors);
  EXPECT_EQ(launches[1].size(), static_cast<size_t>(gpu::kMaxChunkBlocks));
  EXPECT_EQ(launches[2].front(),
            std::make_pair(300, static_cast<int32_t>(gpu::kMaxChunkBlocks - 43)));
}

// GPT-2 small's 148 parameters (124.4M elements) in 65,536-element chunks, as AdamW and the
// gradient norm cut them: 1,995 chunks, one launch (issue 46's optimizer budget).
TEST(ChunkPlan, Gpt2SmallsParametersTakeOneLaunch) {
  std::vector<int64_t> sizes = {50257 * 768, 1024 * 768};  // wte, wpe
  for (int layer = 0; layer < 12; ++layer) {
    for (int64_t n : {768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072,
                      3072 * 768, 768})
      sizes.push_back(n);
  }
  sizes.push_back(768);  // ln_f
  sizes.push_back(768);
  ASSERT_EQ(sizes.size(), 148u);
  const std::vector<PlannedLaunch> launches = plan_launches(sizes, 65536);
  expect_every_chunk_once_in_order(sizes, 65536, launches);
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].size(), 1995u);
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
