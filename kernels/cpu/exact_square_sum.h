#pragma once
// Note [Exact sums of squares]
// The gradient norm must not depend on how a gradient is split between ranks, or sharded
// strategies could not give bitwise the same clipped update as DDP. Float addition is not
// associative, so instead every square is added *exactly*: the square of an f32 value is a
// 48-bit integer times 2^k with k in [-298, 208], so all of them fit one fixed-point integer
// of 32-bit limbs (a Kulisch accumulator). Partial sums from any split, merged in any order,
// give the same integer, and value() rounds that integer to double the same way every time.
// Limbs are int64 with deferred carries: each deposit adds less than 2^32 to a limb, and
// the accumulator normalises itself long before a limb could overflow. Squares are summed
// per exponent first (exactly, in 64-bit buckets) and deposited bucket by bucket.

#include <array>
#include <cstdint>

namespace loom::kernels::cpu {

class ExactSquareSum {
 public:
  static constexpr int kLimbs = 20;  // 640 bits: the largest sum of 2^60 squares fits

  // Adds x[i]^2 for every i. NaN and infinities are counted, not added.
  void add_squares(const float* x, int64_t n);
  // Adds another accumulator's sum (from another part of the same vector).
  void merge(const ExactSquareSum& other);
  // The sum rounded to double (deterministic function of the exact sum); NaN when a NaN was
  // added, infinity when an infinity was.
  double value() const;

  // The state as int64 words (limbs normalised to [0, 2^32), then the NaN and infinity counts)
  // so that ranks can sum it with an integer allreduce, and back.
  static constexpr int kWords = kLimbs + 2;
  std::array<int64_t, kWords> words() const;
  static ExactSquareSum from_words(const std::array<int64_t, kWords>& words);

 private:
  void add_serial(const float* x, int64_t n);
  void normalise();

  std::array<int64_t, kLimbs> limbs_{};
  int64_t nans_ = 0;
  int64_t infs_ = 0;
  int64_t since_normalised_ = 0;
};

}  // namespace loom::kernels::cpu
