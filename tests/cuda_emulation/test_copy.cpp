// kernels/cuda/copy.cu under the emulator against the CPU: copy_strided between all 49 dtype
// pairs over random strided and broadcast layouts, fills in every dtype, and autocast's
// multi-tensor casts, with the CPU's conversion rules (core/dtype.cpp's bf16 and f16 rounding).

#include "kernels/cuda/copy.h"

#include "conversion_oracle.h"
#include "emulation_test_util.h"
#include "random_layouts.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;

TEST(EmulatedCopy, CopyStridedConvertsEveryDtypePairAsTheCpu) {
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

TEST(EmulatedCopy, FillWritesTheCpuValueInEveryDtype) {
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

TEST(EmulatedCopy, MultiTensorCastToBf16) { check_multi_tensor_cast<__nv_bfloat16>(); }
TEST(EmulatedCopy, MultiTensorCastToF16) { check_multi_tensor_cast<__half>(); }

}  // namespace
}  // namespace loom::cuda_emulation::testing
