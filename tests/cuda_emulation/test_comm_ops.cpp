// kernels/cuda/comm_ops.cu under the emulator against kernels/cpu/reduce_ops: combining a
// received buffer into an accumulator for every op and dtype, bitwise, NaNs meeting numbers,
// infinities of both signs and signed zeros included; finishing averages (integer divisors past 32 bits); contiguous conversions.

#include "kernels/cuda/comm_ops.h"

#include "conversion_oracle.h"
#include "emulation_test_util.h"
#include "kernels/cpu/reduce_ops.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

// Elements with NaNs, infinities and zeros of both signs, at positions that depend on
// `phase`, so that between two buffers of different phases a NaN meets a number, +0 meets
// -0, and inf meets -inf (a NaN the kernel makes itself, which it must store canonical).
std::vector<unsigned char> awkward_elements(DType d, int64_t n, std::mt19937_64& rng, int phase) {
  auto raw = random_elements(d, n, rng, /*nan=*/false);
  if (!is_floating(d)) return raw;
  for (int64_t i = 0; i < n; ++i) {
    double v;
    switch ((i + phase) % 13) {
      case 2: v = std::nan(""); break;
      case 5: v = (i / 13 + phase) % 2 == 0 ? 0.0 : -0.0; break;
      case 7: v = (i / 13 + phase) % 2 == 0 ? INFINITY : -INFINITY; break;
      default: continue;
    }
    write_converted(DType::F64, reinterpret_cast<const unsigned char*>(&v), d,
                    raw.data() + i * dtype_size(d));
  }
  return raw;
}

TEST(EmulatedCommOps, ReduceInplaceHoldsTheCpuBackendsBits) {
  std::mt19937_64 rng(67);
  const std::pair<gpu::CommReduce, cpu::ReduceKind> ops[] = {
      {gpu::CommReduce::Sum, cpu::ReduceKind::Sum},
      {gpu::CommReduce::Avg, cpu::ReduceKind::Sum},  // Avg combines as Sum
      {gpu::CommReduce::Min, cpu::ReduceKind::Min},
      {gpu::CommReduce::Max, cpu::ReduceKind::Max},
      {gpu::CommReduce::Prod, cpu::ReduceKind::Prod}};
  for_each_schedule([&] {
    for (DType d : kAllDtypes) {
      for (const auto& [gop, cop] : ops) {
        for (int64_t n : {1, 7, 8, 100, 4101}) {
          for (int phase : {0, 3, 13}) {
          const auto acc0 = awkward_elements(d, n, rng, 0), x = awkward_elements(d, n, rng, phase);
          auto want = acc0;
          cpu::reduce_into(d, cop, want.data(), x.data(), static_cast<size_t>(n));
          auto acc = acc0;
          gpu::reduce_inplace(gop, d, acc.data(), x.data(), n, nullptr);
          ASSERT_EQ(acc, want) << dtype_name(d) << " op " << static_cast<int>(gop) << " n " << n;
          // acc and x may be the same buffer.
          auto same = acc0, same_want = acc0;
          cpu::reduce_into(d, cop, same_want.data(), acc0.data(),
                           static_cast<size_t>(n));
          gpu::reduce_inplace(gop, d, same.data(), same.data(), n, nullptr);
          ASSERT_EQ(same, same_want) << dtype_name(d) << " in place";
          }
        }
      }
    }
  });
}

TEST(EmulatedCommOps, DivideInplaceFinishesAverages) {
  std::mt19937_64 rng(71);
  for (DType d : kAllDtypes) {
    for (int64_t divisor : {int64_t{3}, int64_t{-7}, (int64_t{1} << 33) + 1}) {
      if (d != DType::I64 && divisor > (int64_t{1} << 31)) continue;
      const int64_t n = 77;
      const auto in = random_elements(d, n, rng, false);
      std::vector<unsigned char> want(in.size());
      for (int64_t i = 0; i < n; ++i) {
        const unsigned char* p = in.data() + i * dtype_size(d);
        unsigned char* q = want.data() + i * dtype_size(d);
        if (!is_floating(d)) {  // truncation toward zero, wrapping into the type
          const int64_t v = read_integer(d, p) / divisor;
          write_converted(DType::I64, reinterpret_cast<const unsigned char*>(&v), d, q);
        } else if (d == DType::F64) {
          const double v = read_double(d, p) / static_cast<double>(divisor);
          std::memcpy(q, &v, 8);
        } else {  // in f32 by the divisor rounded to f32, then rounded to the storage type
          const float f = static_cast<float>(read_double(d, p)) / static_cast<float>(divisor);
          const double v = f;
          write_converted(DType::F64, reinterpret_cast<const unsigned char*>(&v), d, q);
        }
      }
      auto out = in;
      gpu::divide_inplace(d, out.data(), divisor, n, nullptr);
      ASSERT_EQ(out, want) << dtype_name(d) << " / " << divisor;
    }
  }
}

TEST(EmulatedCommOps, ConvertMatchesTheCpuRulesForEveryPair) {
  std::mt19937_64 rng(73);
  for (DType src : kAllDtypes) {
    for (DType dst : kAllDtypes) {
      for (int64_t n : {1, 9, 1031}) {
        const bool nan = is_floating(dst) && dst != DType::F16 && src != DType::F16;
        const auto in = random_elements(src, n, rng, nan);
        std::vector<unsigned char> want(static_cast<size_t>(n) * dtype_size(dst));
        for (int64_t i = 0; i < n; ++i)
          write_converted(src, in.data() + i * dtype_size(src), dst,
                          want.data() + i * dtype_size(dst));
        std::vector<unsigned char> out(want.size());
        gpu::convert(src, in.data(), dst, out.data(), n, nullptr);
        ASSERT_EQ(out, want) << dtype_name(src) << " -> " << dtype_name(dst) << " n " << n;
      }
    }
  }
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
