// kernels/cpu/gemm.h's f32 product where an operand's rows lie a multiple of 512 floats apart
// and the product is large (Note [Rows 512 floats apart]: such operands are copied into
// longer rows first): every transposition, accumulating or not, against the exact product,
// with NaN between the rows' ends and the next row (never read); the same bits on any
// thread count.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace loom::kernels::cpu {
namespace {

// 96 x 80 x 520: 4.0M multiply-adds (blocked), both sides of C at least 64, and operands
// stored with leading dimension 1024 (A, B) and 512 + 80 (C).
constexpr int64_t kM = 96, kN = 80, kK = 520, kLd = 1024, kLdc = 592;

struct Product {
  std::vector<float> c;
  std::vector<double> exact, magnitude;
};

Product run(bool trans_a, bool trans_b, bool accumulate, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Row-major storage: `rows` rows of `cols` values, NaN up to the leading dimension.
  auto stored = [&](int64_t rows, int64_t cols, int64_t ld) {
    std::vector<float> x(static_cast<size_t>(rows * ld), nan);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) x[r * ld + j] = uniform(rng);
    return x;
  };
  const auto a = trans_a ? stored(kK, kM, kLd) : stored(kM, kK, kLd);
  const auto b = trans_b ? stored(kN, kK, kLd) : stored(kK, kN, kLd);
  Product p;
  p.c = stored(kM, kN, kLdc);
  const std::vector<float> before = p.c;
  gemm<float>(trans_a, trans_b, kM, kN, kK, a.data(), kLd, b.data(), kLd, p.c.data(), kLdc,
              accumulate);
  for (int64_t i = 0; i < kM; ++i) {
    for (int64_t j = 0; j < kN; ++j) {
      double sum = accumulate ? before[i * kLdc + j] : 0, mag = std::abs(sum);
      for (int64_t l = 0; l < kK; ++l) {
        const double x = trans_a ? a[l * kLd + i] : a[i * kLd + l];
        const double y = trans_b ? b[j * kLd + l] : b[l * kLd + j];
        sum += x * y;
        mag += std::abs(x * y);
      }
      p.exact.push_back(sum);
      p.magnitude.push_back(mag);
    }
  }
  return p;
}

// f32 sums over k terms: at most (k + 1) units of 2^-23 of the terms' magnitude.
TEST(GemmF32, RowsAMultipleOf512FloatsApartGiveTheProduct) {
  for (int t = 0; t < 8; ++t) {
    const bool trans_a = t & 1, trans_b = t & 2, accumulate = t & 4;
    const Product p = run(trans_a, trans_b, accumulate, 11 + t);
    double worst = 0;
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        const size_t e = static_cast<size_t>(i * kN + j);
        const double bound = double(kK + 1) * std::ldexp(1.0, -23) * p.magnitude[e];
        const double error = std::abs(double(p.c[i * kLdc + j]) - p.exact[e]);
        worst = std::max(worst, std::isnan(error) ? INFINITY : error / bound);
      }
    }
    EXPECT_LE(worst, 1.0) << "trans_a " << trans_a << " trans_b " << trans_b << " accumulate "
                          << accumulate;
  }
}

TEST(GemmF32, RowsAMultipleOf512FloatsApartGiveTheSameBitsOnAnyThreadCount) {
  for (int t = 0; t < 4; ++t) {
    set_num_threads(1);
    const std::vector<float> one = run(t & 1, t & 2, false, 5).c;
    set_num_threads(3);
    const std::vector<float> three = run(t & 1, t & 2, false, 5).c;
    set_num_threads(1);
    ASSERT_EQ(one.size(), three.size());
    for (size_t i = 0; i < one.size(); ++i) {
      if (std::isnan(one[i]) && std::isnan(three[i])) continue;  // the rows' padding
      ASSERT_EQ(one[i], three[i]) << "element " << i << ", transpositions " << t;
    }
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
