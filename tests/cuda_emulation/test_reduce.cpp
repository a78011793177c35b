// kernels/cuda/reduce.cu under the emulator against kernels/cpu: sums and maxima over an
// axis (rows and columns kernels), argmax with the CPU's NaN rule, and the whole-buffer sums
// (the two-kernel partial-sum path) and the multi-tensor sums of squares, in f32, f64, bf16
// and f16, the same bits under every schedule.

#include "kernels/cuda/reduce.h"

#include <limits>

#include "emulation_test_util.h"
#include "kernels/cpu/optimizer_steps.h"
#include "kernels/cpu/reduce.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

struct Axis {
  int64_t outer, extent, inner;
};
// inner == 1 reduces rows; inner > 1 reduces columns. Extents around warps and blocks; from
// 1024 rows on, columns are summed in chunks through a workspace (a last chunk that is short,
// and one chunk per 256 rows up to the cap of 256 chunks, are the cases below).
const Axis kAxes[] = {{1, 1, 1},     {3, 5, 1},      {2, 33, 1},  {4, 1000, 1},
                      {1, 3000, 1},  {2, 3, 7},      {3, 64, 5},  {1, 300, 33},
                      {2, 1, 40},    {1, 1100, 33},  {2, 1024, 3}, {1, 70000, 2}};

template <typename T>
void check_axis_reductions() {
  std::mt19937_64 rng(31);
  for (const auto& a : kAxes) {
    SCOPED_TRACE("outer " + std::to_string(a.outer) + " extent " + std::to_string(a.extent) +
                 " inner " + std::to_string(a.inner));
    const size_t n = static_cast<size_t>(a.outer * a.extent * a.inner),
                 m = static_cast<size_t>(a.outer * a.inner);
    const auto x = random_values<T>(n, rng);
    const auto xw = widen_all(x);
    std::vector<Wide<T>> want_sum(m), want_max(m);
    std::vector<int64_t> want_arg(m);
    cpu::sum_axis(xw.data(), want_sum.data(), a.outer, a.extent, a.inner);
    cpu::max_axis(xw.data(), want_max.data(), want_arg.data(), a.outer, a.extent, a.inner);
    std::vector<T> first;
    for_each_schedule([&] {
      std::vector<T> sum(m), max(m);
      std::vector<int64_t> arg(m, -1);
      std::vector<double> workspace(
          gpu::sum_axis_workspace_bytes(dtype_of<T>(), a.outer, a.extent, a.inner) / sizeof(double) +
          1);
      gpu::sum_axis(dtype_of<T>(), dtype_of<T>(), x.data(), sum.data(), a.outer, a.extent, a.inner,
                    workspace.data(), nullptr);
      if constexpr (sizeof(T) == 2) {
        // Summed into f32: the same sums, not rounded (the 16-bit result is their rounding).
        std::vector<float> wide(m);
        gpu::sum_axis(dtype_of<T>(), DType::F32, x.data(), wide.data(), a.outer, a.extent, a.inner,
                      workspace.data(), nullptr);
        std::vector<T> rounded(m);
        for (size_t i = 0; i < m; ++i)
          rounded[i] = from_double<T>(wide[i]);
        EXPECT_TRUE(bitwise_equal(rounded, sum));
      }
      // A sum of up to 3000 terms in a tree order: relative to the terms' magnitudes.
      EXPECT_LE(max_relative_error(sum, want_sum, 4.0), tolerance<T>() * 8);
      gpu::max_axis(dtype_of<T>(), x.data(), max.data(), arg.data(), a.outer, a.extent,
                    a.inner, nullptr);
      EXPECT_EQ(max_relative_error(max, want_max), 0.0);
      EXPECT_EQ(arg, want_arg);
      if (first.empty()) first = sum;
      EXPECT_TRUE(bitwise_equal(first, sum));
    });
  }
}

TEST(EmulatedReduce, AxisSumsAndMaximaF32) { check_axis_reductions<float>(); }
TEST(EmulatedReduce, AxisSumsAndMaximaF64) { check_axis_reductions<double>(); }
TEST(EmulatedReduce, AxisSumsAndMaximaBf16) { check_axis_reductions<__nv_bfloat16>(); }
TEST(EmulatedReduce, AxisSumsAndMaximaF16) { check_axis_reductions<__half>(); }

TEST(EmulatedReduce, ArgmaxFollowsTheCpuNanRule) {
  // A NaN first wins with index 0; a NaN later is never chosen.
  const float nan = std::nanf("");
  const std::vector<float> x = {nan, 1, 2, /**/ 1, nan, 3, /**/ 5, 5, 1};
  std::vector<float> want_max(3);
  std::vector<int64_t> want_arg(3);
  cpu::max_axis(x.data(), want_max.data(), want_arg.data(), 3, 3, 1);
  for_each_schedule([&] {
    std::vector<float> max(3);
    std::vector<int64_t> arg(3);
    gpu::max_axis(DType::F32, x.data(), max.data(), arg.data(), 3, 3, 1, nullptr);
    EXPECT_EQ(arg, want_arg);
    EXPECT_TRUE(std::isnan(max[0]));
    EXPECT_EQ(max[1], 3.0f);
    EXPECT_EQ(max[2], 5.0f);
  });
}

template <typename T>
void check_whole_sums() {
  std::mt19937_64 rng(37);
  for (int64_t n : {0, 1, 31, 1000, 4097, 70001}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto x = random_values<T>(static_cast<size_t>(n), rng);
    const auto xw = widen_all(x);
    const double want_sum = cpu::sum_all(xw.data(), n);
    const double want_squares = cpu::sum_of_squares(xw.data(), n);
    std::vector<T> first;
    for_each_schedule([&] {
      std::vector<double> workspace(gpu::reduce_workspace_bytes(n) / sizeof(double) + 1);
      std::vector<T> sum(1);
      float squares = -1;
      gpu::sum_all(dtype_of<T>(), x.data(), n, sum.data(), workspace.data(), nullptr);
      gpu::sum_of_squares(dtype_of<T>(), x.data(), n, &squares, workspace.data(), nullptr);
      // Added in double, rounded once: the CPU's double sum rounded to T (f64: up to the
      // reassociation of the double sum).
      if constexpr (std::is_same_v<T, double>) {
        EXPECT_NEAR(sum[0], want_sum, 1e-13 * std::max(1.0, std::abs(want_sum)));
      } else {
        EXPECT_EQ(to_double(sum[0]), to_double(from_double<T>(want_sum)));
      }
      EXPECT_EQ(squares, static_cast<float>(want_squares));
      if (first.empty()) first = sum;
      EXPECT_TRUE(bitwise_equal(first, sum));
    });
  }
}

TEST(EmulatedReduce, WholeBufferSumsF32) { check_whole_sums<float>(); }
TEST(EmulatedReduce, WholeBufferSumsBf16) { check_whole_sums<__nv_bfloat16>(); }
TEST(EmulatedReduce, WholeBufferSumsF64) { check_whole_sums<double>(); }

// Many tensors in a few launches, as the gradient norm takes them (more than one launch
// table's 256 tensors, tensors of several 65,536-element chunks, empty and misaligned ones):
// each tensor's sum
// is the CPU's double sum rounded once, with the same bits whether the tensors go in one call
// or one at a time, under every schedule.
template <typename T>
void check_multi_tensor_squares() {
  std::mt19937_64 rng(13);
  std::vector<std::vector<T>> tensors;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{65536}, int64_t{140001}})
    tensors.push_back(random_values<T>(static_cast<size_t>(n), rng));
  for (int k = 0; k < 264; ++k)
    tensors.push_back(random_values<T>(static_cast<size_t>(1 + 23 * k), rng));
  std::vector<gpu::TensorSpan> spans;
  for (const auto& t : tensors) spans.push_back({t.data(), static_cast<int64_t>(t.size())});
  spans.push_back({tensors[3].data() + 1, 70000});  // not 16-byte aligned: single loads
  const int count = static_cast<int>(spans.size());
  const auto workspace_for = [](const gpu::TensorSpan* first, int n) {
    return std::vector<double>(gpu::multi_tensor_squares_workspace_bytes(first, n) /
                                   sizeof(double) + 1);
  };
  std::vector<float> alone(spans.size(), -1.0f);
  for (int k = 0; k < count; ++k) {
    auto workspace = workspace_for(&spans[k], 1);
    gpu::multi_tensor_sum_of_squares(dtype_of<T>(), &spans[k], 1, &alone[k], workspace.data(),
                                     nullptr);
  }
  for_each_schedule([&] {
    auto workspace = workspace_for(spans.data(), count);
    std::vector<float> squares(spans.size(), -1.0f);
    gpu::multi_tensor_sum_of_squares(dtype_of<T>(), spans.data(), count, squares.data(),
                                     workspace.data(), nullptr);
    for (size_t k = 0; k < spans.size(); ++k) {
      const T* first = static_cast<const T*>(spans[k].data);
      const auto w = widen_all(std::vector<T>(first, first + spans[k].n));
      const double want = cpu::sum_of_squares(w.data(), static_cast<int64_t>(w.size()));
      EXPECT_EQ(squares[k], static_cast<float>(want)) << "tensor " << k;
    }
    EXPECT_TRUE(bitwise_equal(squares, alone)) << "grouping changed the bits";
    // Unrounded: the double totals the float ones round, near the CPU's double sums.
    std::vector<double> wide(spans.size(), -1.0);
    gpu::multi_tensor_sum_of_squares(dtype_of<T>(), spans.data(), count, wide.data(),
                                     workspace.data(), nullptr);
    for (size_t k = 0; k < spans.size(); ++k) {
      EXPECT_EQ(static_cast<float>(wide[k]), squares[k]) << "tensor " << k;
      const T* first = static_cast<const T*>(spans[k].data);
      const auto w = widen_all(std::vector<T>(first, first + spans[k].n));
      EXPECT_NEAR(wide[k], cpu::sum_of_squares(w.data(), static_cast<int64_t>(w.size())),
                  1e-12 * wide[k])
          << "tensor " << k;
    }
  });
  float out = 0;
  EXPECT_THROW(gpu::multi_tensor_sum_of_squares(dtype_of<T>(), spans.data(), count, &out, nullptr,
                                                nullptr),
               loom::Error);
}

TEST(EmulatedReduce, MultiTensorSumsOfSquaresF32) { check_multi_tensor_squares<float>(); }
TEST(EmulatedReduce, MultiTensorSumsOfSquaresBf16) {
  check_multi_tensor_squares<__nv_bfloat16>();
}

// Gradient clipping's norm and factor on the device: the bits of the host's arithmetic
// (optim::grad_norm's norm of per-gradient norms, clip_grads_to_norm's coefficient, written
// out here as they compute it), for norms below, at and above the limit, non-finite ones and
// none at all.
TEST(EmulatedReduce, ClipCoefficientHasTheHostsBits) {
  std::mt19937_64 rng(17);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::vector<float>> cases = {
      {}, {4.0f}, {0.3f, 1e-3f, 2.5f, 7e4f}, random_values<float>(300, rng, 0.0, 2.0),
      {1.0f, inf}, {std::nanf(""), 1.0f}};
  for (const double max_norm : {1.0, 0.5, 1e3, std::numeric_limits<double>::infinity()}) {
    for (const auto& squares : cases) {
      double total = 0.0;
      for (float s : squares) {
        const double norm = std::sqrt(static_cast<double>(s));
        total += norm * norm;
      }
      total = std::sqrt(total);
      const double coefficient = max_norm / (total + 1e-6);
      const float want_factor = coefficient < 1.0 ? static_cast<float>(coefficient) : 1.0f;
      double got_total = -1.0;
      float got_factor = -1.0f;
      gpu::clip_coefficient(squares.data(), static_cast<int>(squares.size()), max_norm, &got_total,
                            &got_factor, nullptr);
      SCOPED_TRACE("max_norm " + std::to_string(max_norm) + ", " +
                   std::to_string(squares.size()) + " gradients");
      EXPECT_TRUE(bitwise_equal(std::vector<double>{got_total}, std::vector<double>{total}));
      EXPECT_TRUE(bitwise_equal(std::vector<float>{got_factor}, std::vector<float>{want_factor}));
    }
  }
  double total = 0;
  float factor = 0;
  EXPECT_THROW(gpu::clip_coefficient(nullptr, 0, 0.0, &total, &factor, nullptr), loom::Error);
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
