// kernels/cuda/rotary.cu under the emulator against kernels/cpu/rotary: both round every
// product and sum as written, so forward and backward agree bitwise, in f32, f64, bf16 and
// f16, with f32 tables and tables in x's dtype, on x (and y, dx) laid out as Llama's q and k
// are (a [batch, time, heads, dim] projection seen as [batch, heads, time, dim]) and
// contiguous, dy contiguous.

#include "kernels/cuda/rotary.h"

#include <type_traits>

#include "emulation_test_util.h"
#include "kernels/cpu/rotary.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

// The CPU kernels' storage type for the emulated kernels' T (the same bits).
template <typename T>
using CpuOf = std::conditional_t<std::is_same_v<T, __nv_bfloat16>, BFloat16,
                                 std::conditional_t<std::is_same_v<T, __half>, Half, T>>;

template <typename T>
const CpuOf<T>* on_cpu(const std::vector<T>& v) {
  return reinterpret_cast<const CpuOf<T>*>(v.data());
}
template <typename T>
CpuOf<T>* on_cpu(std::vector<T>& v) {
  return reinterpret_cast<CpuOf<T>*>(v.data());
}

struct Case {
  int64_t batch, heads, time, dim;
  bool heads_interleaved;  // x seen through [batch, time, heads, dim], as the projection lies
};
const Case kCases[] = {
    {1, 1, 1, 2, false}, {2, 3, 5, 8, true}, {1, 4, 7, 64, true}, {3, 2, 9, 6, false}};

template <typename T, typename C>
void check_rotary() {
  std::mt19937_64 rng(31);
  for (const Case& c : kCases) {
    SCOPED_TRACE("case " + std::to_string(c.batch) + "x" + std::to_string(c.heads) + "x" +
                 std::to_string(c.time) + "x" + std::to_string(c.dim));
    const auto n = static_cast<size_t>(c.batch * c.heads * c.time * c.dim);
    const auto table = static_cast<size_t>(c.time * c.dim);
    const auto x = random_values<T>(n, rng), dy = random_values<T>(n, rng);
    const auto cos = random_values<C>(table, rng, -1.0, 1.0);
    const auto sin = random_values<C>(table, rng, -1.0, 1.0);
    const int64_t stride_t = c.heads_interleaved ? c.heads * c.dim : c.dim;
    const int64_t stride_h = c.heads_interleaved ? c.dim : c.time * c.dim;
    const int64_t stride_b = c.heads * c.time * c.dim;
    // y and dx in x's layout, dy contiguous: both kinds of layout on each side.
    const gpu::RotaryLayout strided{stride_b, stride_h, stride_t};
    const gpu::RotaryLayout packed{c.heads * c.time * c.dim, c.time * c.dim, c.dim};
    std::vector<T> want_y(n), want_dx(n);
    cpu::rotary_forward<CpuOf<T>, CpuOf<C>>(on_cpu(x), c.batch, c.heads, c.time, c.dim, stride_b,
                                            stride_h, stride_t, on_cpu(cos), on_cpu(sin),
                                            on_cpu(want_y), stride_b, stride_h, stride_t);
    cpu::rotary_backward<CpuOf<T>, CpuOf<C>>(on_cpu(dy), c.batch, c.heads, c.time, c.dim, packed.b,
                                             packed.h, packed.t, on_cpu(cos), on_cpu(sin),
                                             on_cpu(want_dx), stride_b, stride_h, stride_t);
    for_each_schedule([&] {
      std::vector<T> y(n), dx(n);
      gpu::rotary_forward(dtype_of<T>(), dtype_of<C>(), x.data(), strided, c.batch, c.heads, c.time,
                          c.dim, cos.data(), sin.data(), y.data(), strided, nullptr);
      gpu::rotary_backward(dtype_of<T>(), dtype_of<C>(), dy.data(), packed, c.batch, c.heads,
                           c.time, c.dim, cos.data(), sin.data(), dx.data(), strided, nullptr);
      EXPECT_TRUE(bitwise_equal(y, want_y));
      EXPECT_TRUE(bitwise_equal(dx, want_dx));
    });
  }
}

TEST(EmulatedRotary, F32) {
  check_rotary<float, float>();
}
TEST(EmulatedRotary, F64) {
  check_rotary<double, double>();
}
TEST(EmulatedRotary, F64WithF32Tables) {
  check_rotary<double, float>();
}
TEST(EmulatedRotary, Bf16) {
  check_rotary<__nv_bfloat16, __nv_bfloat16>();
}
TEST(EmulatedRotary, Bf16WithF32Tables) {
  check_rotary<__nv_bfloat16, float>();
}
TEST(EmulatedRotary, F16WithF32Tables) {
  check_rotary<__half, float>();
}

TEST(EmulatedRotary, AnOddDimOrTablesOfAThirdDtypeAreRefused) {
  const gpu::RotaryLayout layout{6, 6, 6};
  EXPECT_THROW(gpu::rotary_forward(DType::F32, DType::F32, nullptr, layout, 1, 1, 1, 3, nullptr,
                                   nullptr, nullptr, layout, nullptr),
               Error);
  EXPECT_THROW(gpu::rotary_backward(DType::BF16, DType::F16, nullptr, layout, 1, 1, 1, 2, nullptr,
                                    nullptr, nullptr, layout, nullptr),
               Error);
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
