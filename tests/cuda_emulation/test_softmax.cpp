// kernels/cuda/softmax.cu under the emulator against kernels/cpu/softmax: softmax forward
// (plain and causal) and backward, the fused cross-entropy forward and backward (of whole rows
// and of a part of the classes; both in one pass, and its rescaling), on warp- and block-per-row
// widths, aligned and not, in f32, bf16 and f16, under every schedule.

#include "kernels/cuda/softmax.h"

#include "emulation_test_util.h"
#include "kernels/cpu/softmax.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

struct RowShape {
  int64_t rows, width;
};
// Widths below, at and past a warp, odd ones (no 16-byte packs), and past the warp-per-row
// limit for packed (2052 f32 = 513 packs) and unpacked (515) rows.
const RowShape kShapes[] = {{1, 1}, {3, 5}, {9, 32}, {17, 33}, {5, 100}, {2, 515}, {2, 2052}};

template <typename T>
void check_softmax() {
  std::mt19937_64 rng(11);
  for (const auto& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " width " + std::to_string(s.width));
    const size_t n = static_cast<size_t>(s.rows * s.width);
    const auto x = random_values<T>(n, rng, -6, 6);
    const auto dy = random_values<T>(n, rng);
    std::vector<Wide<T>> want(n), want_dx(n);
    const auto xw = widen_all(x);
    cpu::softmax_forward(xw.data(), want.data(), s.rows, s.width, 0);
    std::vector<T> y_rounded(n);
    for (size_t i = 0; i < n; ++i) y_rounded[i] = from_double<T>(want[i]);
    const auto yw = widen_all(y_rounded), dyw = widen_all(dy);
    cpu::softmax_backward(yw.data(), dyw.data(), want_dx.data(), s.rows, s.width);
    std::vector<T> first;
    for_each_schedule([&] {
      std::vector<T> y(n), dx(n);
      gpu::softmax_forward(dtype_of<T>(), x.data(), y.data(), s.rows, s.width, 0, nullptr);
      EXPECT_LE(max_relative_error(y, want), tolerance<T>());
      gpu::softmax_backward(dtype_of<T>(), y_rounded.data(), dy.data(), dx.data(), s.rows,
                            s.width, nullptr);
      EXPECT_LE(max_relative_error(dx, want_dx), tolerance<T>());
      if (first.empty()) first = y;
      EXPECT_TRUE(bitwise_equal(first, y)) << "softmax differs from one schedule to another";
    });
  }
}

TEST(EmulatedSoftmax, ForwardAndBackwardF32) { check_softmax<float>(); }
TEST(EmulatedSoftmax, ForwardAndBackwardBf16) { check_softmax<__nv_bfloat16>(); }
TEST(EmulatedSoftmax, ForwardAndBackwardF16) { check_softmax<__half>(); }

// Rows whose exps all underflow or overflow unless the row's maximum is subtracted first.
TEST(EmulatedSoftmax, RowsFarFromZeroAreShiftedByTheirMaximum) {
  std::mt19937_64 rng(13);
  for (double centre : {-950.0, 950.0}) {
    for (int64_t width : {5, 33, 515, 2052}) {
      const int64_t rows = 3;
      const size_t n = static_cast<size_t>(rows * width);
      const auto x = random_values<float>(n, rng, centre - 50, centre + 50);
      std::vector<float> want(n), y(n);
      cpu::softmax_forward(x.data(), want.data(), rows, width, 0);
      std::vector<int64_t> targets = {0, width / 2, width - 1};
      std::vector<float> lse(3), want_lse(3), losses(3), mean(1);
      cpu::cross_entropy_forward(x.data(), targets.data(), want_lse.data(), rows, width);
      for_each_schedule([&] {
        gpu::softmax_forward(DType::F32, x.data(), y.data(), rows, width, 0, nullptr);
        EXPECT_LE(max_relative_error(y, want), tolerance<float>()) << "width " << width;
        gpu::cross_entropy_forward(DType::F32, x.data(), targets.data(), lse.data(),
                                   losses.data(), mean.data(), rows, width, nullptr);
        EXPECT_LE(max_relative_error(lse, want_lse), tolerance<float>()) << "width " << width;
      });
    }
  }
}

TEST(EmulatedSoftmax, CausalRowsSeeOnlyThePast) {
  std::mt19937_64 rng(3);
  for (int64_t t : {1, 7, 32, 40}) {
    const int64_t rows = 2 * t;  // two [T, T] blocks
    const size_t n = static_cast<size_t>(rows * t);
    const auto x = random_values<float>(n, rng, -4, 4);
    std::vector<float> want(n);
    cpu::softmax_forward(x.data(), want.data(), rows, t, t);
    for_each_schedule([&] {
      std::vector<float> y(n, -1.0f);
      gpu::softmax_forward(DType::F32, x.data(), y.data(), rows, t, t, nullptr);
      EXPECT_LE(max_relative_error(y, want), tolerance<float>()) << "T " << t;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = r % t + 1; c < t; ++c) ASSERT_EQ(y[r * t + c], 0.0f);
    });
  }
}

template <typename T>
void check_cross_entropy() {
  std::mt19937_64 rng(5);
  for (const auto& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " vocab " + std::to_string(s.width));
    const size_t n = static_cast<size_t>(s.rows * s.width);
    const auto logits = random_values<T>(n, rng, -8, 8);
    std::vector<int64_t> targets(static_cast<size_t>(s.rows));
    std::uniform_int_distribution<int64_t> pick(0, s.width - 1);
    for (auto& t : targets) t = pick(rng);
    const auto lw = widen_all(logits);
    std::vector<Wide<T>> want_lse(targets.size()), want_grad(n);
    const double want_mean =
        cpu::cross_entropy_forward(lw.data(), targets.data(), want_lse.data(), s.rows, s.width);
    const float dloss = 1.5f;  // the loss and its gradient are f32 for every storage
    const auto scale = static_cast<Wide<T>>(double(dloss) / static_cast<double>(s.rows));
    cpu::cross_entropy_backward(lw.data(), targets.data(), want_lse.data(), scale,
                                want_grad.data(), s.rows, s.width);
    std::vector<float> first_mean;
    for_each_schedule([&] {
      std::vector<float> lse(targets.size()), losses(targets.size()), mean(1);
      std::vector<T> grad(n);
      gpu::cross_entropy_forward(dtype_of<T>(), logits.data(), targets.data(), lse.data(),
                                 losses.data(), mean.data(), s.rows, s.width, nullptr);
      EXPECT_LE(max_relative_error(lse, want_lse), tolerance<float>());
      EXPECT_LE(std::abs(double(mean[0]) - want_mean) / std::max(1.0, std::abs(want_mean)),
                tolerance<float>());
      if (first_mean.empty()) first_mean = mean;
      EXPECT_TRUE(bitwise_equal(first_mean, mean)) << "the mean loss must be deterministic";
      gpu::cross_entropy_backward(dtype_of<T>(), logits.data(), targets.data(), lse.data(),
                                  &dloss, grad.data(), s.rows, s.width, nullptr);
      EXPECT_LE(max_relative_error(grad, want_grad, 1e-2), 4 * tolerance<T>());
      // dlogits may alias logits.
      std::vector<T> in_place = logits;
      gpu::cross_entropy_backward(dtype_of<T>(), in_place.data(), targets.data(), lse.data(),
                                  &dloss, in_place.data(), s.rows, s.width, nullptr);
      EXPECT_TRUE(bitwise_equal(in_place, grad));

      // Both in one pass, for a gradient known beforehand: the same bits, written over the
      // logits; rescaled by the backward only when the loss's gradient is another.
      std::vector<T> fused = logits;
      std::vector<float> fused_lse(targets.size()), fused_losses(targets.size()), fused_mean(1);
      gpu::cross_entropy_forward_backward(dtype_of<T>(), fused.data(), targets.data(),
                                          fused_lse.data(), fused_losses.data(), fused_mean.data(),
                                          dloss, s.rows, s.width, nullptr);
      EXPECT_TRUE(bitwise_equal(fused_lse, lse));
      EXPECT_TRUE(bitwise_equal(fused_losses, losses));
      EXPECT_TRUE(bitwise_equal(fused_mean, mean));
      EXPECT_TRUE(bitwise_equal(fused, grad));
      gpu::cross_entropy_rescale(dtype_of<T>(), fused.data(), &dloss, dloss,
                                 static_cast<int64_t>(n), nullptr);
      EXPECT_TRUE(bitwise_equal(fused, grad)) << "rescaled for the gradient it was written for";
      const float other = 0.375f;
      std::vector<T> want_other(n);
      gpu::cross_entropy_backward(dtype_of<T>(), logits.data(), targets.data(), lse.data(), &other,
                                  want_other.data(), s.rows, s.width, nullptr);
      gpu::cross_entropy_rescale(dtype_of<T>(), fused.data(), &other, dloss,
                                 static_cast<int64_t>(n), nullptr);
      // Rounded once more than the backward's: within two of T's units in the last place.
      EXPECT_LE(max_relative_error(fused, want_other, 1e-2), 2 * tolerance<T>());
      if (s.width > 1) {  // (one class: a gradient of zeros)
        EXPECT_GT(max_relative_error(fused, grad, 1e-2), 0.1) << "not rescaled";
      }
    });
  }
}

TEST(EmulatedCrossEntropy, ForwardAndBackwardF32) { check_cross_entropy<float>(); }
TEST(EmulatedCrossEntropy, ForwardAndBackwardBf16) { check_cross_entropy<__nv_bfloat16>(); }

// A part of the classes (tensor parallelism): the logits are classes [width, 2 width) of rows
// of 3 width, targets anywhere in the row. Forward: the part's logsumexp and the target's
// logit where the part holds it (else 0); backward with a whole-row logsumexp (here the
// part's plus 1), no onehot for targets outside.
template <typename T>
void check_cross_entropy_part() {
  std::mt19937_64 rng(6);
  for (const auto& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " part of " + std::to_string(s.width));
    const size_t n = static_cast<size_t>(s.rows * s.width);
    const auto logits = random_values<T>(n, rng, -8, 8);
    std::vector<int64_t> targets(static_cast<size_t>(s.rows));
    std::uniform_int_distribution<int64_t> pick(0, 3 * s.width - 1);
    for (auto& t : targets) t = pick(rng);
    targets[0] = s.width;  // one target inside the part at least
    const int64_t first = s.width;
    const auto lw = widen_all(logits);
    std::vector<Wide<T>> want_lse(targets.size()), want_picked(targets.size()), want_grad(n);
    cpu::cross_entropy_part_forward(lw.data(), targets.data(), first, want_lse.data(),
                                    want_picked.data(), s.rows, s.width);
    std::vector<float> whole_lse(targets.size());
    for (size_t r = 0; r < whole_lse.size(); ++r)
      whole_lse[r] = static_cast<float>(want_lse[r]) + 1.0f;
    const std::vector<Wide<T>> whole_wide(whole_lse.begin(), whole_lse.end());
    const float dloss = 1.5f;
    const auto scale = static_cast<Wide<T>>(double(dloss) / static_cast<double>(s.rows));
    cpu::cross_entropy_backward(lw.data(), targets.data(), whole_wide.data(), scale,
                                want_grad.data(), s.rows, s.width, {first, true});
    for_each_schedule([&] {
      std::vector<float> lse(targets.size()), picked(targets.size(), -7.0f);
      std::vector<T> grad(n);
      gpu::cross_entropy_part_forward(dtype_of<T>(), logits.data(), targets.data(), first,
                                      lse.data(), picked.data(), s.rows, s.width, nullptr);
      EXPECT_LE(max_relative_error(lse, want_lse), tolerance<float>());
      EXPECT_EQ(max_relative_error(picked, want_picked), 0.0);  // a copy of the logit, or 0
      gpu::cross_entropy_backward(dtype_of<T>(), logits.data(), targets.data(), whole_lse.data(),
                                  &dloss, grad.data(), s.rows, s.width, nullptr, {first, true});
      EXPECT_LE(max_relative_error(grad, want_grad, 1e-2), 4 * tolerance<T>());
    });
  }
}

TEST(EmulatedCrossEntropy, PartOfTheClassesF32) { check_cross_entropy_part<float>(); }
TEST(EmulatedCrossEntropy, PartOfTheClassesBf16) { check_cross_entropy_part<__nv_bfloat16>(); }

TEST(EmulatedCrossEntropy, ATargetOutOfRangeTrapsTheLaunch) {
  const std::vector<float> logits(4 * 10, 0.5f);
  const std::vector<int64_t> targets = {1, 2, 10, 3};
  std::vector<float> lse(4), losses(4), mean(1);
  EXPECT_THROW(gpu::cross_entropy_forward(DType::F32, logits.data(), targets.data(), lse.data(),
                                          losses.data(), mean.data(), 4, 10, nullptr),
               loom::Error);
  EXPECT_EQ(device_error(), cudaErrorLaunchFailure);
  clear_device_error();
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
