// kernels/cuda/layer_norm.cu under the emulator against kernels/cpu/layer_norm: forward on
// warp- and block-per-row widths, backward with its two-kernel parameter-gradient sum, in
// f32, bf16 and f16, and with an f32 input whose output and output gradient are bf16 or f16
// (a norm before autocast's products), bitwise identical under every schedule; the residual
// add in front of it (an f32 stream with a residual of its dtype or 16 bits); the same for
// RMS norm, which shares the kernels.

#include "kernels/cuda/layer_norm.h"

#include "emulation_test_util.h"
#include "kernels/cpu/layer_norm.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

struct Shape {
  int64_t rows, width;
};
// Rows around the backward kernel's 16-row chunks; widths below, at and past a warp, odd,
// past the param-grad kernel's 32 columns, and past the warp-per-row limit.
const Shape kShapes[] = {{1, 1}, {3, 7}, {16, 32}, {17, 33}, {33, 96}, {5, 515}, {2, 2052}};

// T: the storage of x, the parameters and their gradients; L: of y and dy.
template <typename T, typename L = T>
void check_layer_norm() {
  std::mt19937_64 rng(23);
  const double eps = 1e-5;
  for (const auto& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " width " + std::to_string(s.width));
    const size_t n = static_cast<size_t>(s.rows * s.width), w = static_cast<size_t>(s.width),
                 r = static_cast<size_t>(s.rows);
    const auto x = random_values<T>(n, rng, -3, 3);
    const auto weight = random_values<T>(w, rng, 0.5, 1.5);
    const auto bias = random_values<T>(w, rng);
    const auto dy = random_values<L>(n, rng);
    const auto xw = widen_all(x), ww = widen_all(weight), bw = widen_all(bias),
               dyw = widen_all(dy);
    std::vector<Wide<T>> want_y(n), want_mean(r), want_rstd(r), want_dx(n), want_dw(w, 0),
        want_db(w, 0);
    cpu::layer_norm_forward(xw.data(), ww.data(), bw.data(), want_y.data(), want_mean.data(),
                            want_rstd.data(), s.rows, s.width, eps);
    cpu::layer_norm_backward(dyw.data(), xw.data(), ww.data(), want_mean.data(),
                             want_rstd.data(), want_dx.data(), want_dw.data(), want_db.data(),
                             s.rows, s.width);
    std::vector<T> first_dw;
    for_each_schedule([&] {
      std::vector<L> y(n);
      std::vector<T> dx(n), dw(w), db(w);
      std::vector<float> mean(r), rstd(r);
      gpu::layer_norm_forward(dtype_of<T>(), dtype_of<L>(), x.data(), weight.data(), bias.data(),
                              y.data(), mean.data(), rstd.data(), s.rows, s.width, eps, nullptr);
      EXPECT_LE(max_relative_error(y, want_y), tolerance<L>());
      EXPECT_LE(max_relative_error(mean, want_mean), 1e-5);
      EXPECT_LE(max_relative_error(rstd, want_rstd), 1e-5);
      std::vector<float> workspace(gpu::layer_norm_backward_workspace(s.rows, s.width) /
                                       sizeof(float) + 1);
      gpu::layer_norm_backward(dtype_of<T>(), dtype_of<L>(), dy.data(), x.data(), weight.data(),
                               mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), s.rows,
                               s.width, workspace.data(), nullptr);
      EXPECT_LE(max_relative_error(dx, want_dx), 4 * tolerance<T>());
      EXPECT_LE(max_relative_error(dw, want_dw), 4 * tolerance<T>());
      EXPECT_LE(max_relative_error(db, want_db), 4 * tolerance<T>());
      if (first_dw.empty()) first_dw = dw;
      EXPECT_TRUE(bitwise_equal(first_dw, dw)) << "parameter gradients must be deterministic";
    });
  }
}

// add_layer_norm (add_rms_norm when not centered): x, sum, dsum, dx and the parameters of T;
// y, dy and dresidual of L; the residual of R.
template <typename T, typename L = T, typename R = L>
void check_add_norm(bool centered) {
  std::mt19937_64 rng(31);
  const double eps = 1e-5;
  for (const auto& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " width " + std::to_string(s.width));
    const size_t n = static_cast<size_t>(s.rows * s.width), w = static_cast<size_t>(s.width),
                 r = static_cast<size_t>(s.rows);
    const auto x = random_values<T>(n, rng, -3, 3);
    const auto residual = random_values<R>(n, rng, -1, 1);
    const auto weight = random_values<T>(w, rng, 0.5, 1.5);
    const auto bias = random_values<T>(w, rng);
    const auto dy = random_values<L>(n, rng);
    const auto dsum = random_values<T>(n, rng);
    const auto xw = widen_all(x), rw = widen_all(residual), ww = widen_all(weight),
               bw = widen_all(bias), dyw = widen_all(dy), dsw = widen_all(dsum);
    // The kernel stores the sum in T and normalises what it stored (as add, then the norm).
    std::vector<Wide<T>> want_sum(n);
    for (size_t i = 0; i < n; ++i)
      want_sum[i] = static_cast<Wide<T>>(to_double(from_double<T>(xw[i] + rw[i])));
    std::vector<Wide<T>> want_y(n), want_mean(r), want_rstd(r), want_dx(n), want_dw(w, 0),
        want_db(w, 0);
    if (centered) {
      cpu::layer_norm_forward(want_sum.data(), ww.data(), bw.data(), want_y.data(),
                              want_mean.data(), want_rstd.data(), s.rows, s.width, eps);
      cpu::add_layer_norm_backward(dyw.data(), dsw.data(), want_sum.data(), ww.data(),
                                   want_mean.data(), want_rstd.data(), want_dx.data(),
                                   static_cast<Wide<T>*>(nullptr), want_dw.data(),
                                   want_db.data(), s.rows, s.width);
    } else {
      cpu::rms_norm_forward(want_sum.data(), ww.data(), want_y.data(), want_rstd.data(), s.rows,
                            s.width, eps);
      cpu::add_rms_norm_backward(dyw.data(), dsw.data(), want_sum.data(), ww.data(),
                                 want_rstd.data(), want_dx.data(),
                                 static_cast<Wide<T>*>(nullptr), want_dw.data(), s.rows,
                                 s.width);
    }
    for_each_schedule([&] {
      std::vector<T> sum(n), dx(n), dw(w), db(w);
      std::vector<L> y(n), dres(n);
      std::vector<float> mean(r), rstd(r);
      if (centered) {
        gpu::add_layer_norm_forward(dtype_of<T>(), dtype_of<L>(), dtype_of<R>(), x.data(),
                                    residual.data(), weight.data(), bias.data(), sum.data(),
                                    y.data(), mean.data(), rstd.data(), s.rows, s.width, eps,
                                    nullptr);
        EXPECT_LE(max_relative_error(mean, want_mean), 1e-5);
      } else {
        gpu::add_rms_norm_forward(dtype_of<T>(), dtype_of<L>(), dtype_of<R>(), x.data(),
                                  residual.data(), weight.data(), sum.data(), y.data(),
                                  rstd.data(), s.rows, s.width, eps, nullptr);
      }
      EXPECT_LE(max_relative_error(sum, want_sum), tolerance<T>());
      EXPECT_LE(max_relative_error(y, want_y), tolerance<L>());
      EXPECT_LE(max_relative_error(rstd, want_rstd), 1e-5);
      std::vector<float> workspace(gpu::layer_norm_backward_workspace(s.rows, s.width) /
                                       sizeof(float) + 1);
      // The backward reads the sum the forward wrote, as the op's does.
      if (centered) {
        gpu::add_layer_norm_backward(dtype_of<T>(), dtype_of<L>(), dy.data(), dsum.data(),
                                     sum.data(), weight.data(), mean.data(), rstd.data(),
                                     dx.data(), dres.data(), dw.data(), db.data(), s.rows,
                                     s.width, workspace.data(), nullptr);
        EXPECT_LE(max_relative_error(db, want_db), 4 * tolerance<T>());
      } else {
        gpu::add_rms_norm_backward(dtype_of<T>(), dtype_of<L>(), dy.data(), dsum.data(),
                                   sum.data(), weight.data(), rstd.data(), dx.data(), dres.data(),
                                   dw.data(), s.rows, s.width, workspace.data(), nullptr);
      }
      EXPECT_LE(max_relative_error(dx, want_dx), 4 * tolerance<T>());
      EXPECT_LE(max_relative_error(dres, want_dx), 4 * tolerance<T>() + tolerance<L>());
      EXPECT_LE(max_relative_error(dw, want_dw), 4 * tolerance<T>());
    });
  }
}

template <typename T, typename L = T>
void check_rms_norm() {
  std::mt19937_64 rng(29);
  const double eps = 1e-6;
  for (const auto& s : kShapes) {
    SCOPED_TRACE("rows " + std::to_string(s.rows) + " width " + std::to_string(s.width));
    const size_t n = static_cast<size_t>(s.rows * s.width), w = static_cast<size_t>(s.width),
                 r = static_cast<size_t>(s.rows);
    const auto x = random_values<T>(n, rng, -3, 3);
    const auto weight = random_values<T>(w, rng, 0.5, 1.5);
    const auto dy = random_values<L>(n, rng);
    const auto xw = widen_all(x), ww = widen_all(weight), dyw = widen_all(dy);
    std::vector<Wide<T>> want_y(n), want_rstd(r), want_dx(n), want_dw(w, 0);
    cpu::rms_norm_forward(xw.data(), ww.data(), want_y.data(), want_rstd.data(), s.rows, s.width,
                          eps);
    cpu::rms_norm_backward(dyw.data(), xw.data(), ww.data(), want_rstd.data(), want_dx.data(),
                           want_dw.data(), s.rows, s.width);
    std::vector<T> first_dw;
    for_each_schedule([&] {
      std::vector<L> y(n);
      std::vector<T> dx(n), dw(w);
      std::vector<float> rstd(r);
      gpu::rms_norm_forward(dtype_of<T>(), dtype_of<L>(), x.data(), weight.data(), y.data(),
                            rstd.data(), s.rows, s.width, eps, nullptr);
      EXPECT_LE(max_relative_error(y, want_y), tolerance<L>());
      EXPECT_LE(max_relative_error(rstd, want_rstd), 1e-5);
      std::vector<float> workspace(gpu::layer_norm_backward_workspace(s.rows, s.width) /
                                       sizeof(float) + 1);
      gpu::rms_norm_backward(dtype_of<T>(), dtype_of<L>(), dy.data(), x.data(), weight.data(),
                             rstd.data(), dx.data(), dw.data(), s.rows, s.width, workspace.data(),
                             nullptr);
      EXPECT_LE(max_relative_error(dx, want_dx), 4 * tolerance<T>());
      EXPECT_LE(max_relative_error(dw, want_dw), 4 * tolerance<T>());
      if (first_dw.empty()) first_dw = dw;
      EXPECT_TRUE(bitwise_equal(first_dw, dw)) << "parameter gradients must be deterministic";
    });
  }
}

TEST(EmulatedLayerNorm, ForwardAndBackwardF32) { check_layer_norm<float>(); }
TEST(EmulatedLayerNorm, ForwardAndBackwardBf16) { check_layer_norm<__nv_bfloat16>(); }
TEST(EmulatedLayerNorm, ForwardAndBackwardF16) { check_layer_norm<__half>(); }

TEST(EmulatedLayerNorm, F32InputWithBf16OutputAndGradient) {
  check_layer_norm<float, __nv_bfloat16>();
}
TEST(EmulatedLayerNorm, F32InputWithF16OutputAndGradient) { check_layer_norm<float, __half>(); }

TEST(EmulatedAddLayerNorm, F32) { check_add_norm<float>(true); }
TEST(EmulatedAddLayerNorm, Bf16) { check_add_norm<__nv_bfloat16>(true); }
TEST(EmulatedAddLayerNorm, F32StreamWithABf16Residual) {
  check_add_norm<float, __nv_bfloat16>(true);
}
TEST(EmulatedAddLayerNorm, F32StreamWithAnF16Residual) { check_add_norm<float, __half>(true); }
TEST(EmulatedAddLayerNorm, F32StreamAndResidualWithABf16Output) {
  check_add_norm<float, __nv_bfloat16, float>(true);
}
TEST(EmulatedAddRmsNorm, F32) { check_add_norm<float>(false); }
TEST(EmulatedAddRmsNorm, F32StreamAndResidualWithAnF16Output) {
  check_add_norm<float, __half, float>(false);
}
TEST(EmulatedAddRmsNorm, F32StreamWithABf16Residual) {
  check_add_norm<float, __nv_bfloat16>(false);
}

TEST(EmulatedRmsNorm, ForwardAndBackwardF32) { check_rms_norm<float>(); }
TEST(EmulatedRmsNorm, ForwardAndBackwardBf16) { check_rms_norm<__nv_bfloat16>(); }
TEST(EmulatedRmsNorm, ForwardAndBackwardF16) { check_rms_norm<__half>(); }
TEST(EmulatedRmsNorm, F32InputWithBf16OutputAndGradient) { check_rms_norm<float, __nv_bfloat16>(); }

// The output dtype must be the input's or, for an f32 input, bf16/f16: a named error otherwise.
TEST(EmulatedLayerNorm, AnOutputDtypeItCannotWriteIsANamedError) {
  float x = 1, weight = 1, bias = 0, y = 0, mean = 0, rstd = 0;
  try {
    gpu::layer_norm_forward(DType::BF16, DType::F32, &x, &weight, &bias, &y, &mean, &rstd, 1, 1,
                            1e-5, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16 or f16; got f32 for bf16"), std::string::npos)
        << e.what();
  }
}

TEST(EmulatedLayerNorm, NoRowsGivesZeroParameterGradients) {
  std::vector<float> dw(9, 7.0f), db(9, 7.0f);
  gpu::layer_norm_backward(DType::F32, DType::F32, nullptr, nullptr, nullptr, nullptr, nullptr,
                           nullptr, dw.data(), db.data(), 0, 9, nullptr, nullptr);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(dw[i], 0.0f);
    EXPECT_EQ(db[i], 0.0f);
  }
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
