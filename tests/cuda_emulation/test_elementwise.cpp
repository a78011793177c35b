// kernels/cuda/elementwise.cu under the emulator against the CPU: binary ops over random
// broadcast/strided layouts of up to 8 dims, the contiguous maps on misaligned pointers,
// GELU and the fused bias + GELU, fills and copy_strided between all 49 dtype pairs, with the
// CPU's conversion rules (core/dtype.cpp's bf16 and f16 rounding), and the multi-tensor
// scaling of gradient clipping.

#include "kernels/cuda/elementwise.h"

#include <cstring>

#include "emulation_test_util.h"
#include "kernels/cpu/elementwise.h"
#include "conversion_oracle.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

// A shape and an operand's strides into a buffer of `span` elements: dimensions permuted,
// stepped, or broadcast (stride 0).
struct Layout {
  std::vector<int64_t> strides;
  int64_t span = 1;
};

std::vector<int64_t> random_shape(std::mt19937_64& rng, int max_dims) {
  std::uniform_int_distribution<int> dims(0, max_dims), extent(1, 4);
  std::vector<int64_t> shape(static_cast<size_t>(dims(rng)));
  for (auto& d : shape) d = extent(rng);
  return shape;
}

Layout random_layout(const std::vector<int64_t>& shape, std::mt19937_64& rng, bool broadcast) {
  const size_t ndim = shape.size();
  std::vector<size_t> order(ndim);
  for (size_t i = 0; i < ndim; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_int_distribution<int> step(1, 2), coin(0, 3);
  Layout l;
  l.strides.assign(ndim, 0);
  int64_t stride = 1;
  for (size_t i : order) {
    if (broadcast && coin(rng) == 0) continue;  // stride 0
    l.strides[i] = stride * step(rng);
    stride = l.strides[i] * shape[i];
  }
  l.span = 1;
  for (size_t i = 0; i < ndim; ++i) l.span += (shape[i] - 1) * l.strides[i];
  return l;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Offset of the i-th element (row-major over `shape`) through `strides`.
int64_t offset_of(int64_t i, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

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

TEST(EmulatedElementwise, CopyStridedConvertsEveryDtypePairAsTheCpu) {
  std::mt19937_64 rng(53);
  int checked = 0;
  for (DType src : kAllDtypes) {
    for (DType dst : kAllDtypes) {
      for (int trial = 0; trial < 6; ++trial) {
        // Float NaNs into integers are undefined on the CPU; f16 NaN payloads may differ.
        const bool nan = is_floating(dst) && dst != DType::F16 && src != DType::F16;
        std::vector<int64_t> shape = trial == 0 ? std::vector<int64_t>{37} : random_shape(rng, 6);
        const Layout l = trial == 0 ? Layout{{1}, 37} : random_layout(shape, rng, trial % 2 == 1);
        const auto in = random_elements(src, l.span, rng, nan);
        const int64_t n = numel(shape);
        std::vector<unsigned char> want(static_cast<size_t>(n) * dtype_size(dst));
        for (int64_t i = 0; i < n; ++i) {
          write_converted(src, in.data() + offset_of(i, shape, l.strides) * dtype_size(src),
                          dst, want.data() + i * dtype_size(dst));
        }
        std::vector<unsigned char> out(want.size(), 0xAB);
        gpu::copy_strided(src, static_cast<int>(shape.size()), shape.data(), in.data(),
                          l.strides.data(), dst, out.data(), nullptr);
        ASSERT_EQ(out, want) << dtype_name(src) << " -> " << dtype_name(dst) << " trial " << trial;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 49 * 6);
}

TEST(EmulatedElementwise, FillWritesTheCpuValueInEveryDtype) {
  for (DType d : kAllDtypes) {
    for (double value : {0.0, -3.75, 2.5e-3, 77.9}) {
      const int64_t n = 45;
      std::vector<unsigned char> want(static_cast<size_t>(n) * dtype_size(d));
      for (int64_t i = 0; i < n; ++i)
        write_converted(DType::F64, reinterpret_cast<const unsigned char*>(&value), d,
                        want.data() + i * dtype_size(d));
      for (int64_t shift : {0, 1}) {  // and off 16-byte alignment
        std::vector<unsigned char> out(want.size() + dtype_size(d), 0xCD);
        gpu::fill(d, out.data() + shift * dtype_size(d), value, n, nullptr);
        ASSERT_EQ(std::vector<unsigned char>(out.begin() + shift * dtype_size(d),
                                             out.begin() + shift * dtype_size(d) + want.size()),
                  want)
            << dtype_name(d) << " value " << value;
      }
    }
  }
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

// Autocast's weight casts of a step in one launch (over one launch table's 256 tensors, tensors
// of several chunks, empty ones, and a source and a target off 16-byte alignment): every
// element bitwise as copy_strided converts it.
template <typename Dst>
void check_multi_tensor_cast() {
  std::mt19937_64 rng(23);
  std::vector<std::vector<float>> sources;
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{65537}, int64_t{140001}})
    sources.push_back(random_values<float>(static_cast<size_t>(n), rng, -3e4, 3e4));
  for (int k = 0; k < 260; ++k)
    sources.push_back(random_values<float>(static_cast<size_t>(1 + 17 * k), rng));
  std::vector<std::vector<Dst>> want;
  for (const auto& x : sources) {
    want.emplace_back(x.size());
    const int64_t shape[1] = {static_cast<int64_t>(x.size())}, strides[1] = {1};
    gpu::copy_strided(DType::F32, 1, shape, x.data(), strides, dtype_of<Dst>(), want.back().data(),
                      nullptr);
  }
  for_each_schedule([&] {
    std::vector<std::vector<Dst>> got;
    std::vector<const void*> src;
    std::vector<void*> dst;
    std::vector<int64_t> sizes;
    for (const auto& x : sources) got.emplace_back(x.size());
    for (size_t k = 0; k < sources.size(); ++k) {
      src.push_back(sources[k].data());
      dst.push_back(got[k].data());
      sizes.push_back(static_cast<int64_t>(sources[k].size()));
    }
    // The third source once more from its second element into the fourth target's second:
    // single accesses on both sides.
    std::vector<Dst> shifted(sources[2].size());
    src.push_back(sources[2].data() + 1);
    dst.push_back(shifted.data() + 1);
    sizes.push_back(static_cast<int64_t>(sources[2].size()) - 1);
    gpu::multi_tensor_cast(DType::F32, dtype_of<Dst>(), src.data(), dst.data(), sizes.data(),
                           static_cast<int>(src.size()), nullptr);
    for (size_t k = 0; k < sources.size(); ++k)
      EXPECT_TRUE(bitwise_equal(got[k], want[k])) << "tensor " << k;
    const std::vector<Dst> tail(shifted.begin() + 1, shifted.end());
    EXPECT_TRUE(bitwise_equal(tail, std::vector<Dst>(want[2].begin() + 1, want[2].end())));
  });
  EXPECT_THROW(gpu::multi_tensor_cast(DType::BF16, DType::F32, nullptr, nullptr, nullptr, 0,
                                      nullptr),
               Error);
}

TEST(EmulatedElementwise, MultiTensorCastToBf16) { check_multi_tensor_cast<__nv_bfloat16>(); }
TEST(EmulatedElementwise, MultiTensorCastToF16) { check_multi_tensor_cast<__half>(); }

}  // namespace
}  // namespace loom::cuda_emulation::testing
