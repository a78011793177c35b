// kernels/cuda/elementwise.cu under the emulator against the CPU: binary ops over random
// broadcast/strided layouts of up to 8 dims, the contiguous maps on misaligned pointers, an f32
// tensor plus a 16-bit one, GELU and the fused bias + GELU, SiLU, SwiGLU, and the multi-tensor
// scaling of gradient clipping. (Fills, copies and conversions: test_copy.cpp.)

#include "kernels/cuda/elementwise.h"

#include <cstring>

#include "emulation_test_util.h"
#include "kernels/cpu/elementwise.h"
#include "random_layouts.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

template <typename T>
void check_binary_layouts() {
  std::mt19937_64 rng(41);
  const gpu::BinaryOp gops[] = {gpu::BinaryOp::Add, gpu::BinaryOp::Sub, gpu::BinaryOp::Mul,
                                gpu::BinaryOp::Div};
  const cpu::BinaryOp cops[] = {cpu::BinaryOp::Add, cpu::BinaryOp::Sub, cpu::BinaryOp::Mul,
                                cpu::BinaryOp::Div};
  for (int trial = 0; trial < 60; ++trial) {
    const auto shape = random_shape(rng, trial < 50 ? 5 : gpu::kMaxDims);
    const Layout la = random_layout(shape, rng, true), lb = random_layout(shape, rng, true);
    const auto a = random_values<T>(static_cast<size_t>(la.span), rng);
    const auto b = random_values<T>(static_cast<size_t>(lb.span), rng, 0.5, 3.0);
    const auto aw = widen_all(a), bw = widen_all(b);
    const int op = trial % 4;
    std::vector<Wide<T>> want(static_cast<size_t>(numel(shape)));
    cpu::binary(cops[op], static_cast<int>(shape.size()), shape.data(), aw.data(),
                la.strides.data(), bw.data(), lb.strides.data(), want.data());
    std::vector<T> want_t(want.size());
    for (size_t i = 0; i < want.size(); ++i) want_t[i] = from_double<T>(want[i]);
    std::vector<T> out(want.size());
    gpu::binary(gops[op], dtype_of<T>(), static_cast<int>(shape.size()), shape.data(), a.data(),
                la.strides.data(), b.data(), lb.strides.data(), out.data(), nullptr);
    // One operation in the compute type, rounded once: the CPU's bits exactly.
    ASSERT_TRUE(bitwise_equal(out, want_t)) << "trial " << trial << " op " << op;
  }
}

TEST(EmulatedElementwise, BinaryOverBroadcastStridedLayoutsF32) {
  for_each_schedule([] { check_binary_layouts<float>(); });
}
TEST(EmulatedElementwise, BinaryOverBroadcastStridedLayoutsF64) { check_binary_layouts<double>(); }
TEST(EmulatedElementwise, BinaryOverBroadcastStridedLayoutsBf16) {
  check_binary_layouts<__nv_bfloat16>();
}

// Contiguous maps: sizes around the 16-byte vectors, pointers off 16-byte alignment.
template <typename T>
void check_maps() {
  std::mt19937_64 rng(43);
  for (int64_t n : {1, 3, 4, 7, 8, 9, 33, 1000, 4099}) {
    for (int64_t shift : {0, 1}) {
      SCOPED_TRACE("n " + std::to_string(n) + " shift " + std::to_string(shift));
      const auto a0 = random_values<T>(static_cast<size_t>(n + shift), rng);
      const auto b0 = random_values<T>(static_cast<size_t>(n + shift), rng);
      std::vector<Wide<T>> aw = widen_all(a0), bw = widen_all(b0);
      auto round_all = [](const std::vector<Wide<T>>& v) {
        std::vector<T> out(v.size());
        for (size_t i = 0; i < v.size(); ++i) out[i] = from_double<T>(v[i]);
        return out;
      };
      const auto factor = static_cast<Wide<T>>(0.37), value = static_cast<Wide<T>>(-1.25);
      // a += b
      std::vector<T> a = a0;
      gpu::add_inplace(dtype_of<T>(), a.data() + shift, b0.data() + shift, n, nullptr);
      std::vector<Wide<T>> want = aw;
      cpu::add_inplace(want.data() + shift, bw.data() + shift, n);
      EXPECT_TRUE(bitwise_equal(a, round_all(want))) << "add_inplace";
      // a *= factor
      a = a0;
      gpu::scale_inplace(dtype_of<T>(), a.data() + shift, 0.37, n, nullptr);
      want = aw;
      cpu::scale_inplace(want.data() + shift, factor, n);
      EXPECT_TRUE(bitwise_equal(a, round_all(want))) << "scale_inplace";
      // out = a + value, out = a * factor
      std::vector<T> out(a0.size());
      std::memcpy(out.data(), a0.data(), shift * sizeof(T));
      gpu::add_scalar(dtype_of<T>(), a0.data() + shift, -1.25, out.data() + shift, n, nullptr);
      want = aw;
      cpu::add_scalar(aw.data() + shift, value, want.data() + shift, n);
      EXPECT_TRUE(bitwise_equal(out, round_all(want))) << "add_scalar";
      gpu::scale(dtype_of<T>(), a0.data() + shift, 0.37, out.data() + shift, n, nullptr);
      cpu::scale(aw.data() + shift, factor, want.data() + shift, n);
      EXPECT_TRUE(bitwise_equal(out, round_all(want))) << "scale";
    }
  }
}

TEST(EmulatedElementwise, ContiguousMapsOnMisalignedPointersF32) {
  for_each_schedule([] { check_maps<float>(); });
}
TEST(EmulatedElementwise, ContiguousMapsOnMisalignedPointersF64) { check_maps<double>(); }
TEST(EmulatedElementwise, ContiguousMapsOnMisalignedPointersBf16) { check_maps<__nv_bfloat16>(); }
TEST(EmulatedElementwise, ContiguousMapsOnMisalignedPointersF16) { check_maps<__half>(); }

// An f32 tensor plus a 16-bit one widened on load (the residual stream meeting a matmul
// result; in place, a 16-bit gradient accumulated into an f32 one): bitwise the CPU's, which
// is bitwise add_inplace of the widened values.
template <typename T>
void check_add_widened() {
  std::mt19937_64 rng(47);
  for (int64_t n : {1, 5, 256, 4099}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto a0 = random_values<float>(static_cast<size_t>(n), rng);
    const auto b = random_values<T>(static_cast<size_t>(n), rng);
    std::vector<float> want = a0, widened(static_cast<size_t>(n));
    for (size_t i = 0; i < b.size(); ++i) widened[i] = static_cast<float>(to_double(b[i]));
    cpu::add_inplace(want.data(), widened.data(), n);
    std::vector<float> out(a0.size(), -1.0f), in_place = a0;
    gpu::add_widened(dtype_of<T>(), out.data(), a0.data(), n, b.data(), n, nullptr);
    EXPECT_TRUE(bitwise_equal(out, want));
    gpu::add_widened(dtype_of<T>(), in_place.data(), in_place.data(), n, b.data(), n, nullptr);
    EXPECT_TRUE(bitwise_equal(in_place, want));
    std::vector<float> on_cpu(a0.size(), -1.0f);
    const auto* bits = reinterpret_cast<const uint16_t*>(b.data());
    cpu::add_widened(on_cpu.data(), a0.data(), n, bits, dtype_of<T>(), n);
    EXPECT_TRUE(bitwise_equal(on_cpu, want));
    // An f32 bias of the row's length, broadcast over the rows.
    for (int64_t period : {int64_t{1}, n % 4 == 0 ? n / 4 : n}) {
      SCOPED_TRACE("period " + std::to_string(period));
      std::vector<float> rows(a0.size());
      for (int64_t i = 0; i < n; ++i)
        rows[static_cast<size_t>(i)] =
            a0[static_cast<size_t>(i % period)] + widened[static_cast<size_t>(i)];
      gpu::add_widened(dtype_of<T>(), out.data(), a0.data(), period, b.data(), n, nullptr);
      EXPECT_TRUE(bitwise_equal(out, rows));
      cpu::add_widened(on_cpu.data(), a0.data(), period, bits, dtype_of<T>(), n);
      EXPECT_TRUE(bitwise_equal(on_cpu, rows));
    }
  }
}

TEST(EmulatedElementwise, AddWidenedIsTheSumOfTheWidenedValuesBf16) {
  check_add_widened<__nv_bfloat16>();
}
TEST(EmulatedElementwise, AddWidenedIsTheSumOfTheWidenedValuesF16) {
  check_add_widened<__half>();
}

TEST(EmulatedElementwise, GeluForwardAndBackwardWithinTheDocumentedBounds) {
  std::mt19937_64 rng(47);
  const int64_t n = 3001;
  const auto x = random_values<float>(n, rng, -7, 7);
  const auto dy = random_values<float>(n, rng);
  std::vector<float> want_y(n), want_dx(n), y(n), dx(n);
  cpu::gelu_forward(x.data(), want_y.data(), n);
  cpu::gelu_backward(x.data(), dy.data(), want_dx.data(), n);
  for_each_schedule([&] {
    gpu::gelu_forward(DType::F32, x.data(), y.data(), n, nullptr);
    gpu::gelu_backward(DType::F32, x.data(), dy.data(), dx.data(), n, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      // elementwise.h: a few ulp for x >= -1; ~4e-7 absolute (backward ~2e-6 |dy|) below.
      ASSERT_NEAR(y[i], want_y[i], x[i] >= -1 ? 4e-7 * std::max(1.0f, std::abs(want_y[i])) : 5e-7)
          << "x " << x[i];
      ASSERT_NEAR(dx[i], want_dx[i], 3e-6 * std::max(1.0f, std::abs(dy[i]))) << "x " << x[i];
    }
  });
}

// The fused bias + GELU against the CPU's, within GELU's bounds (tanhf against the CPU's
// polynomial), and in bf16 as the CPU computes it: widened, one f32 result rounded once.
TEST(EmulatedElementwise, BiasGeluForwardAndBackwardWithinGelusBounds) {
  std::mt19937_64 rng(61);
  const int64_t rows = 37, width = 83, n = rows * width;
  const auto x = random_values<float>(n, rng, -6, 6);
  const auto bias = random_values<float>(width, rng, -1, 1);
  const auto dy = random_values<float>(n, rng);
  std::vector<float> want_y(n), want_dx(n), want_dbias(width), y(n), dx(n);
  cpu::bias_gelu_forward(x.data(), bias.data(), want_y.data(), rows, width);
  cpu::bias_gelu_backward(x.data(), bias.data(), dy.data(), want_dx.data(), want_dbias.data(),
                          rows, width);
  for_each_schedule([&] {
    gpu::bias_gelu_forward(DType::F32, x.data(), bias.data(), y.data(), rows, width, nullptr);
    gpu::bias_gelu_backward(DType::F32, x.data(), bias.data(), dy.data(), dx.data(), rows, width,
                            nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const float v = x[i] + bias[i % width];
      ASSERT_NEAR(y[i], want_y[i], v >= -1 ? 4e-7 * std::max(1.0f, std::abs(want_y[i])) : 5e-7)
          << "x + bias " << v;
      ASSERT_NEAR(dx[i], want_dx[i], 3e-6 * std::max(1.0f, std::abs(dy[i]))) << "x + bias " << v;
    }
  });
  // bf16: the emulated kernel's result is the f32 GELU of the widened operands, rounded once.
  std::vector<__nv_bfloat16> xb(n), bb(width), yb(n);
  for (int64_t i = 0; i < n; ++i) xb[i] = __float2bfloat16_rn(x[i]);
  for (int64_t i = 0; i < width; ++i) bb[i] = __float2bfloat16_rn(bias[i]);
  gpu::bias_gelu_forward(DType::BF16, xb.data(), bb.data(), yb.data(), rows, width, nullptr);
  std::vector<float> widened_x(n), widened_b(width), f32_y(n);
  for (int64_t i = 0; i < n; ++i) widened_x[i] = __bfloat162float(xb[i]);
  for (int64_t i = 0; i < width; ++i) widened_b[i] = __bfloat162float(bb[i]);
  gpu::bias_gelu_forward(DType::F32, widened_x.data(), widened_b.data(), f32_y.data(), rows,
                         width, nullptr);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(__bfloat162float(yb[i]), __bfloat162float(__float2bfloat16_rn(f32_y[i]))) << i;
}

TEST(EmulatedElementwise, SiluForwardAndBackwardWithinAFewUlp) {
  std::mt19937_64 rng(59);
  const int64_t n = 3001;
  const auto x = random_values<float>(n, rng, -20, 20);
  const auto dy = random_values<float>(n, rng);
  std::vector<float> want_y(n), want_dx(n), y(n), dx(n);
  cpu::silu_forward(x.data(), want_y.data(), n);
  cpu::silu_backward(x.data(), dy.data(), want_dx.data(), n);
  for_each_schedule([&] {
    gpu::silu_forward(DType::F32, x.data(), y.data(), n, nullptr);
    gpu::silu_backward(DType::F32, x.data(), dy.data(), dx.data(), n, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      // expf against std::exp: a few ulp of the result (absolute near silu's zero at x ~ -20).
      ASSERT_NEAR(y[i], want_y[i], 1e-6 * std::max(1.0f, std::abs(want_y[i]))) << "x " << x[i];
      ASSERT_NEAR(dx[i], want_dx[i], 1e-6 * std::max(1.0f, std::abs(dy[i]))) << "x " << x[i];
    }
  });
}

// SwiGLU as the CPU's swiglu_* in f32 (silu within a few ulp, as above; the product and the
// gradients follow it), and in bf16 within half a unit in the last place of a 16-bit result
// (two roundings to bf16 on the way: silu's and the result's) or the bits.
TEST(EmulatedElementwise, SwigluForwardAndBackwardAsTheCpus) {
  std::mt19937_64 rng(61);
  const int64_t n = 3001;
  const auto gate = random_values<float>(n, rng, -20, 20), up = random_values<float>(n, rng);
  const auto dy = random_values<float>(n, rng);
  std::vector<float> want_y(n), want_dg(n), want_du(n), y(n), dg(n), du(n);
  cpu::swiglu_forward(gate.data(), up.data(), want_y.data(), n);
  cpu::swiglu_backward(gate.data(), up.data(), dy.data(), want_dg.data(), want_du.data(), n);
  const auto gb = random_values<__nv_bfloat16>(n, rng, -20, 20);
  const auto ub = random_values<__nv_bfloat16>(n, rng), dyb = random_values<__nv_bfloat16>(n, rng);
  std::vector<__nv_bfloat16> want_yb(n), want_dgb(n), want_dub(n), yb(n), dgb(n), dub(n);
  const auto as_cpu = [](const std::vector<__nv_bfloat16>& v) {
    return reinterpret_cast<const BFloat16*>(v.data());
  };
  const auto as_cpu_out = [](std::vector<__nv_bfloat16>& v) {
    return reinterpret_cast<BFloat16*>(v.data());
  };
  cpu::swiglu_forward(as_cpu(gb), as_cpu(ub), as_cpu_out(want_yb), n);
  cpu::swiglu_backward(as_cpu(gb), as_cpu(ub), as_cpu(dyb), as_cpu_out(want_dgb),
                       as_cpu_out(want_dub), n);
  for_each_schedule([&] {
    gpu::swiglu_forward(DType::F32, gate.data(), up.data(), y.data(), n, nullptr);
    gpu::swiglu_backward(DType::F32, gate.data(), up.data(), dy.data(), dg.data(), du.data(), n,
                         nullptr);
    for (int64_t i = 0; i < n; ++i) {
      const float scale = std::max(1.0f, std::abs(up[i])) * std::max(1.0f, std::abs(dy[i]));
      ASSERT_NEAR(y[i], want_y[i], 2e-6 * std::max(1.0f, std::abs(want_y[i])))
          << "gate " << gate[i];
      ASSERT_NEAR(du[i], want_du[i], 2e-6 * std::max(1.0f, std::abs(want_du[i]))) << i;
      ASSERT_NEAR(dg[i], want_dg[i], 2e-6 * scale) << "gate " << gate[i];
    }
    gpu::swiglu_forward(DType::BF16, gb.data(), ub.data(), yb.data(), n, nullptr);
    gpu::swiglu_backward(DType::BF16, gb.data(), ub.data(), dyb.data(), dgb.data(), dub.data(), n,
                         nullptr);
    for (int64_t i = 0; i < n; ++i) {
      for (const auto& [got, want] : {std::pair{yb[i], want_yb[i]}, std::pair{dgb[i], want_dgb[i]},
                                      std::pair{dub[i], want_dub[i]}}) {
        const float g = __bfloat162float(got), w = __bfloat162float(want);
        ASSERT_NEAR(g, w, 8e-3 * std::max(1.0f, std::abs(w))) << "element " << i;
      }
    }
  });
}

// Gradient clipping's multi-tensor scaling (over one launch table's 256 tensors, tensors of
// several chunks, empty and misaligned ones): every element bitwise as scale_inplace scales it.
template <typename T>
void check_multi_tensor_scale() {
  std::mt19937_64 rng(17);
  std::vector<std::vector<T>> tensors;
  for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{65537}, int64_t{140001}})
    tensors.push_back(random_values<T>(static_cast<size_t>(n), rng));
  for (int k = 0; k < 260; ++k)
    tensors.push_back(random_values<T>(static_cast<size_t>(1 + 19 * k), rng));
  const double factor = 0.3712;
  std::vector<std::vector<T>> want = tensors;
  for (auto& t : want)
    gpu::scale_inplace(dtype_of<T>(), t.data(), factor, static_cast<int64_t>(t.size()), nullptr);
  gpu::scale_inplace(dtype_of<T>(), want[2].data() + 1, factor,
                     static_cast<int64_t>(want[2].size()) - 1, nullptr);
  for_each_schedule([&] {
    std::vector<std::vector<T>> got = tensors;
    std::vector<void*> data;
    std::vector<int64_t> sizes;
    for (auto& t : got) {
      data.push_back(t.data());
      sizes.push_back(static_cast<int64_t>(t.size()));
    }
    // The third tensor once more from its second element (not 16-byte aligned: single
    // accesses), so that it is scaled twice there.
    data.push_back(got[2].data() + 1);
    sizes.push_back(static_cast<int64_t>(got[2].size()) - 1);
    gpu::multi_tensor_scale(dtype_of<T>(), data.data(), sizes.data(),
                            static_cast<int>(data.size()), factor, nullptr);
    for (size_t k = 0; k < got.size(); ++k)
      EXPECT_TRUE(bitwise_equal(got[k], want[k])) << "tensor " << k;
  });
}

TEST(EmulatedElementwise, MultiTensorScaleF32) { check_multi_tensor_scale<float>(); }
TEST(EmulatedElementwise, MultiTensorScaleBf16) { check_multi_tensor_scale<__nv_bfloat16>(); }

}  // namespace
}  // namespace loom::cuda_emulation::testing
