// kernels/cpu/gemm.h's bf16 product: every transposition, accumulating or not, small and
// blocked shapes, against the exact product of the same bf16 numbers rounded once; the same bits
// on any thread count. On a CPU with AMX or AVX512_BF16 this is oneDNN's bf16 matmul, elsewhere
// the f32 fallback: both must meet the same bound.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace loom::kernels::cpu {
namespace {

struct Case {
  int64_t m, n, k;
};
// Small (one call), blocked by rows (m * n * k >= 2^21, m >= n) and by columns (n > m).
const Case kCases[] = {{5, 7, 3}, {300, 130, 64}, {20, 700, 200}};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<uint16_t> out(n);
  for (auto& x : out)
    x = float_to_bf16_bits(uniform(rng));
  return out;
}

double widen(uint16_t bits) {
  return bf16_bits_to_float(bits);
}

struct Product {
  std::vector<uint16_t> c;  // the kernel's
  std::vector<double> exact, magnitude;  // sum of a*b (+ c), and of |a*b| (+ |c|)
};

Product run(const Case& s, bool trans_a, bool trans_b, bool accumulate, uint32_t seed) {
  std::mt19937 rng(seed);
  // Stored as row-major [m, k] / [k, m] (trans_a) and [k, n] / [n, k] (trans_b), with a
  // leading dimension wider than the rows, and C as [m, n] with ldc = n + 3.
  const int64_t lda = (trans_a ? s.m : s.k) + 2, ldb = (trans_b ? s.k : s.n) + 1, ldc = s.n + 3;
  const auto a = random_bf16(static_cast<size_t>((trans_a ? s.k : s.m) * lda), rng);
  const auto b = random_bf16(static_cast<size_t>((trans_b ? s.n : s.k) * ldb), rng);
  Product p;
  p.c = random_bf16(static_cast<size_t>(s.m * ldc), rng);
  const std::vector<uint16_t> before = p.c;
  gemm_bf16(trans_a, trans_b, s.m, s.n, s.k, a.data(), lda, b.data(), ldb, p.c.data(), ldc,
            accumulate);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double sum = accumulate ? widen(before[i * ldc + j]) : 0, mag = std::abs(sum);
      for (int64_t l = 0; l < s.k; ++l) {
        const double x = widen(trans_a ? a[l * lda + i] : a[i * lda + l]);
        const double y = widen(trans_b ? b[j * ldb + l] : b[l * ldb + j]);
        sum += x * y;
        mag += std::abs(x * y);
      }
      p.exact.push_back(sum);
      p.magnitude.push_back(mag);
    }
  }
  return p;
}

// One rounding to bf16 (half a unit in the 8th bit) plus f32 sums over k terms.
TEST(GemmBf16, EveryTranspositionIsTheExactProductRoundedOnce) {
  for (const Case& s : kCases) {
    for (int t = 0; t < 8; ++t) {
      const bool trans_a = t & 1, trans_b = t & 2, accumulate = t & 4;
      const Product p = run(s, trans_a, trans_b, accumulate, 7 + t);
      const int64_t ldc = s.n + 3;
      double worst = 0;
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          const size_t e = static_cast<size_t>(i * s.n + j);
          const double bound = std::abs(p.exact[e]) * std::ldexp(1.0, -8) +
                               double(s.k + 1) * std::ldexp(1.0, -23) * p.magnitude[e];
          worst = std::max(worst, std::abs(widen(p.c[i * ldc + j]) - p.exact[e]) / bound);
        }
      }
      EXPECT_LE(worst, 1.0) << s.m << " x " << s.n << " x " << s.k << " trans_a " << trans_a
                            << " trans_b " << trans_b << " accumulate " << accumulate << " ("
                            << bf16_gemm_instructions() << ")";
    }
  }
}

TEST(GemmBf16, TheBitsDoNotDependOnTheThreadCount) {
  for (const Case& s : kCases) {
    set_num_threads(1);
    const std::vector<uint16_t> one = run(s, false, true, true, 3).c;
    set_num_threads(3);
    const std::vector<uint16_t> three = run(s, false, true, true, 3).c;
    set_num_threads(1);
    EXPECT_EQ(one, three) << s.m << " x " << s.n << " x " << s.k;
  }
}

}  // namespace
}  // namespace loom::kernels::cpu
