// Tensor handles, views, dtypes, devices and allocator accounting.

#include <gtest/gtest.h>
#include <malloc.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "tensor/ops.h"

namespace loom {
namespace {

// shift + scale * sin(frequency * i + scale) for the i-th element: smooth, signed, and no two
// neighbours alike, for tests that compare bits.
Tensor sine_filled(const Shape& shape, double scale, double shift, double frequency = 0.37) {
  std::vector<float> v;
  for (int64_t i = 0; i < numel_of(shape); ++i)
    v.push_back(static_cast<float>(shift + scale * std::sin(frequency * double(i) + scale)));
  return Tensor::from_vector<float>(v, shape);
}

std::vector<float> bits_of(const Tensor& t) {
  return t.detach().to(DType::F32).to_vector<float>();
}

TEST(Tensor, ViewsShareStorage) {
  Tensor x = Tensor::from_vector<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor t = x.transpose(0, 1);
  Tensor r = x.reshape({3, 2});
  Tensor n = x.narrow(1, 1, 2);
  Tensor e = Tensor::from_vector<float>({7, 8, 9}, {3}).expand({2, 3});
  EXPECT_EQ(t.storage(), x.storage());
  EXPECT_EQ(r.storage(), x.storage());
  EXPECT_EQ(n.storage(), x.storage());
  EXPECT_EQ(e.strides(), Shape({0, 1}));
  x.data<float>()[1] = 42;
  EXPECT_EQ(t.to_vector<float>(), std::vector<float>({0, 3, 42, 4, 2, 5}));
  EXPECT_EQ(n.to_vector<float>(), std::vector<float>({42, 2, 4, 5}));
  EXPECT_EQ(e.to_vector<float>(), std::vector<float>({7, 8, 9, 7, 8, 9}));
}

// A shape whose size in bytes overflows int64 is refused, naming the shape, instead of
// wrapping around to a small allocation.
TEST(Tensor, EmptyRefusesAShapeWhoseSizeOverflows) {
  try {
    (void)Tensor::empty({int64_t{1} << 32, int64_t{1} << 30}, DType::F32);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[4294967296, 1073741824]"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("2^63 bytes"), std::string::npos) << e.what();
  }
  // 2^61 f32 elements are 2^63 bytes: one byte too many.
  EXPECT_THROW((void)Tensor::empty({int64_t{1} << 61}, DType::F32), Error);
  EXPECT_EQ(Tensor::empty({int64_t{1} << 40, 0}, DType::F32).numel(), 0);
}

TEST(Tensor, ContiguousCopiesOnlyWhenNeeded) {
  Tensor x = Tensor::zeros({4, 5});
  EXPECT_TRUE(x.contiguous().is_same(x));
  Tensor t = x.transpose(0, 1);
  EXPECT_FALSE(t.is_contiguous());
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_NE(c.storage(), x.storage());
}

TEST(Tensor, ReshapeOfSplittableViewIsAView) {
  Tensor x = Tensor::zeros({2, 3, 12});
  Tensor piece = split(x, {4, 4, 4}, -1)[1];  // strides [36, 12, 1]
  Tensor heads = piece.reshape({2, 3, 2, 2});
  EXPECT_EQ(heads.storage(), x.storage());
  EXPECT_EQ(heads.strides(), Shape({36, 12, 2, 1}));
  // Merging non-adjacent memory needs a copy.
  EXPECT_NE(piece.reshape({-1}).storage(), x.storage());
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f + 0x1p-8f)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1.0078125 and 1.015625: rounds to 1.015625.
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f + 3 * 0x1p-8f)), 1.015625f);
  EXPECT_EQ(bf16_bits_to_float(float_to_bf16_bits(1.0f + 0x1p-8f + 0x1p-20f)), 1.0078125f);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::nanf("")))));
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
}

TEST(Tensor, F16RoundsToNearestEven) {
  // f16 has 10 mantissa bits: 1 + 2^-11 ties to 1.0, 1 + 3*2^-11 ties to 1 + 2^-9.
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16_bits(70000.0f), 0x7C00);  // overflow -> inf
  EXPECT_EQ(f16_bits_to_float(0x0001), 0x1p-24f);  // smallest subnormal
}

// The conversions are plain C++ (core/half.h) so that every compiler builds them;
// GCC's _Float16 (the F16C rounding) is the reference wherever the compiler has it: every f16
// value both ways, and every 61st f32 bit pattern (about 70 million, all exponents) to f16.
#ifdef __FLT16_MANT_DIG__
TEST(Tensor, F16ConversionsMatchTheCompilersFloat16) {
  for (uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const float expected = static_cast<float>(std::bit_cast<_Float16>(h));
    const float got = f16_bits_to_float(h);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(got)) << bits;
      ASSERT_EQ(std::signbit(got), std::signbit(expected)) << bits;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << bits;
    }
  }
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFu; bits += 61) {
    const float value = std::bit_cast<float>(static_cast<uint32_t>(bits));
    if (std::isnan(value)) continue;  // NaN payloads: F16RoundsToNearestEven covers the sign
    ASSERT_EQ(float_to_f16_bits(value), std::bit_cast<uint16_t>(static_cast<_Float16>(value)))
        << bits;
  }
}
#endif

TEST(Tensor, CastsBetweenAllDtypes) {
  Tensor x = Tensor::from_vector<float>({-2.5f, 0.0f, 1.0f, 3.75f}, {4});
  for (DType d : {DType::F64, DType::BF16, DType::F16}) {
    EXPECT_EQ(x.to(d).to(DType::F32).to_vector<float>(), x.to_vector<float>()) << d;
  }
  EXPECT_EQ(x.to(DType::I32).to_vector<int32_t>(), std::vector<int32_t>({-2, 0, 1, 3}));
  EXPECT_EQ(x.to(DType::I64).to_vector<int64_t>(), std::vector<int64_t>({-2, 0, 1, 3}));
  Tensor bytes = Tensor::from_vector<uint8_t>({0, 7, 255}, {3});
  EXPECT_EQ(bytes.to(DType::I64).to_vector<int64_t>(), std::vector<int64_t>({0, 7, 255}));
  EXPECT_EQ(bytes.to(DType::F32).to_vector<float>(), std::vector<float>({0, 7, 255}));
}

// A cast keeps the layout of a transposed or permuted tensor (PyTorch's preserve_format): the
// elements are converted where they lie and viewed with the same strides; anything with gaps
// (a slice) comes out contiguous.
TEST(Tensor, CastsKeepTheStridesOfDenseTensors) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = transpose(x, 0, 1);  // [3, 2], strides {1, 3}
  for (DType d : {DType::BF16, DType::F64}) {
    Tensor c = cast(t, d);
    EXPECT_EQ(c.strides(), t.strides()) << d;
    EXPECT_EQ(c.to(DType::F32).contiguous().to_vector<float>(),
              std::vector<float>({1, 4, 2, 5, 3, 6}))
        << d;
  }
  Tensor permuted = Tensor::zeros({2, 3, 4}).permute({2, 0, 1});
  EXPECT_EQ(cast(permuted, DType::BF16).strides(), permuted.strides());
  Tensor slice = x.narrow(1, 0, 2);  // [2, 2] of a [2, 3]: a gap between rows
  Tensor c = cast(slice, DType::BF16);
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to(DType::F32).to_vector<float>(), std::vector<float>({1, 2, 4, 5}));
}

TEST(Tensor, DeviceParsing) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::parse("cuda").str(), "cuda:0");
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
}

// Without a CUDA build, or without a GPU, a cuda:0 tensor is an error that says which; with
// both it is created (and the CUDA tests take over).
TEST(Tensor, CudaTensorsNeedACudaBuildAndAGpu) {
  try {
    Tensor::empty({2}, DType::F32, Device::cuda(0));
  } catch (const Error& e) {
    const char* expected = LOOM_WITH_CUDA ? "no CUDA device is available" : "LOOM_WITH_CUDA";
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    return;
  }
  EXPECT_TRUE(LOOM_WITH_CUDA) << "a cuda:0 tensor was created in a build without CUDA";
}

TEST(Tensor, SetDataRepointsEveryHandleAndKeepsIdentity) {
  Tensor p = Tensor::full({2}, 1.0).set_requires_grad(true);
  Tensor alias = p;
  sum(p).backward();
  ASSERT_TRUE(p.grad().defined());
  p.set_data(Tensor::full({3}, 2.0, DType::F64));
  EXPECT_EQ(alias.shape(), Shape{3});
  EXPECT_EQ(alias.dtype(), DType::F64);
  EXPECT_EQ(alias.to_vector<double>(), std::vector<double>({2, 2, 2}));
  EXPECT_TRUE(alias.requires_grad());
  EXPECT_FALSE(alias.grad().defined());  // dropped with the old data
  EXPECT_THROW(mul(p, 2.0).set_data(p), Error);  // not a leaf
}

TEST(Tensor, AllocatorAccountsBytes) {
  Allocator& cpu = allocator_for(Device::cpu());
  cpu.reset_peak();
  size_t before = cpu.stats().current_bytes;
  {
    Tensor a = Tensor::empty({1024}, DType::F64);
    EXPECT_EQ(cpu.stats().current_bytes, before + 8192);
    Tensor b = Tensor::empty({256}, DType::F32);
    EXPECT_EQ(cpu.stats().current_bytes, before + 8192 + 1024);
  }
  EXPECT_EQ(cpu.stats().current_bytes, before);
  EXPECT_GE(cpu.stats().peak_bytes, before + 9216);
}

// Note [Caching CPU blocks]: a large block freed is handed out again for the same size,
// with the alignment that size asks for, and is no longer counted while cached.
TEST(Tensor, CpuAllocatorReusesLargeBlocksBySizeAndAlignment) {
  Allocator& cpu = allocator_for(Device::cpu());
  const size_t before = cpu.stats().current_bytes;
  const size_t pages = size_t{1} << 20, odd = pages + 64;  // page-aligned, 64-byte aligned
  void* a = cpu.allocate(pages);
  cpu.deallocate(a, pages);
  EXPECT_EQ(cpu.stats().current_bytes, before);
  void* b = cpu.allocate(odd);  // another size: not the cached block
  EXPECT_NE(b, a);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  void* c = cpu.allocate(pages);
  EXPECT_EQ(c, a);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c) % 4096, 0u);
  EXPECT_EQ(cpu.stats().current_bytes, before + pages + odd);
  cpu.deallocate(b, odd);
  cpu.deallocate(c, pages);
  EXPECT_EQ(cpu.stats().current_bytes, before);
}

// use_process_heap_for_cpu_blocks (a process-wide setting; ctest runs each test case in its own
// process): a large block comes from glibc's heap, not a mapping of its own, freeing it keeps
// the heap, and the freed memory serves a request of another size. glibc only: sanitizers
// replace malloc, so the test checks the heap where mallinfo2 describes glibc's.
TEST(Tensor, ProcessHeapReuseKeepsLargeBlocksInGlibcsHeap) {
  if (mallinfo2().arena == 0) GTEST_SKIP() << "malloc is not glibc's (a sanitizer build)";
  use_process_heap_for_cpu_blocks();
  Allocator& cpu = allocator_for(Device::cpu());
  const size_t big = size_t{64} << 20;  // above glibc's largest mmap threshold (32 MiB)
  const size_t mapped_before = mallinfo2().hblkhd;
  void* a = cpu.allocate(big);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before);  // not mmapped
  const size_t heap = mallinfo2().arena;
  cpu.deallocate(a, big);
  EXPECT_EQ(mallinfo2().arena, heap);  // not trimmed
  void* b = cpu.allocate(big - (size_t{1} << 20));  // another size, served from the freed block
  EXPECT_EQ(mallinfo2().arena, heap);
  cpu.deallocate(b, big - (size_t{1} << 20));
}

TEST(Tensor, AllocatorAccountsBytesByKind) {
  Allocator& cpu = allocator_for(Device::cpu());
  auto current = [&](MemoryKind kind) {
    return cpu.stats().current_by_kind[static_cast<size_t>(kind)];
  };
  auto peak = [&](MemoryKind kind) { return cpu.stats().peak_by_kind[static_cast<size_t>(kind)]; };
  cpu.reset_peak();
  const size_t params = current(MemoryKind::Parameters), acts = current(MemoryKind::Activations);
  const size_t device = cpu.stats().device_current_bytes;
  {
    Tensor a = Tensor::empty({1024}, DType::F32);  // untagged memory counts as activations
    EXPECT_EQ(current(MemoryKind::Activations), acts + 4096);
    a.storage()->set_kind(MemoryKind::Parameters);
    EXPECT_EQ(current(MemoryKind::Activations), acts);
    EXPECT_EQ(current(MemoryKind::Parameters), params + 4096);
    a.storage()->release();  // a sharded strategy freeing a gathered unit
    EXPECT_EQ(current(MemoryKind::Parameters), params);
    a.storage()->materialize();
    EXPECT_EQ(current(MemoryKind::Parameters), params + 4096);
    EXPECT_EQ(peak(MemoryKind::Parameters), params + 4096);
    Tensor host = Tensor::empty({256}, DType::F32);
    host.storage()->set_kind(MemoryKind::Offloaded);  // not on the compute device
    EXPECT_EQ(cpu.stats().device_current_bytes, device + 4096);
    EXPECT_EQ(current(MemoryKind::Offloaded) >= 1024, true);
  }
  EXPECT_EQ(current(MemoryKind::Parameters), params);
  EXPECT_EQ(current(MemoryKind::Activations), acts);
  EXPECT_EQ(cpu.stats().device_current_bytes, device);
  EXPECT_GE(cpu.stats().device_peak_bytes, device + 4096);
  EXPECT_STREQ(memory_kind_name(MemoryKind::OptimizerState), "optimizer_state");
}

TEST(Tensor, ErrorsNameTheProblem) {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  try {
    add(a, b);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3] and [4] cannot be broadcast"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(matmul(a, a), Error);
  EXPECT_THROW(a.reshape({4, 2}), Error);
  EXPECT_THROW(add(a, Tensor::zeros({2, 3}, DType::I64)), Error);
  EXPECT_THROW(embedding(Tensor::from_vector<int64_t>({3}, {1}), Tensor::zeros({3, 2})), Error);
  Tensor half_row = Tensor::zeros({2}, DType::BF16);
  EXPECT_THROW(layer_norm(half_row, half_row.to(DType::F32), half_row), Error);  // mixed dtypes
}

// A vocabulary-parallel rank's lookup: rows [2, 5) of a 6-row table. Ids outside get zero rows
// and add nothing to the gradient; repeated ids add their rows in order.
TEST(Tensor, EmbeddingPartLooksUpItsRowsOnly) {
  Tensor part = Tensor::from_vector<float>({20, 21, 30, 31, 40, 41}, {3, 2});
  part.set_requires_grad(true);
  const Tensor ids = Tensor::from_vector<int64_t>({0, 2, 4, 5, 2, 3}, {2, 3});
  Tensor out = embedding_part(ids, part, 2);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(out.to_vector<float>(),
            (std::vector<float>{0, 0, 20, 21, 40, 41, 0, 0, 20, 21, 30, 31}));
  const Tensor weights = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
  sum(mul(out, weights)).backward();
  // Row 2 (position 1 and 4): 3 + 9, 4 + 10; row 3 (position 5): 11, 12; row 4 (position 2).
  EXPECT_EQ(part.grad().to_vector<float>(), (std::vector<float>{12, 14, 11, 12, 5, 6}));
  EXPECT_THROW(embedding_part(Tensor::from_vector<int64_t>({-1}, {1}), part, 2), Error);
}

// Two parts of the classes, combined as nn::parallel_cross_entropy combines the ranks', give the
// whole rows' loss and, part by part, their gradient.
TEST(Tensor, CrossEntropyPartsCombineToTheWholeRows) {
  const Tensor whole = Tensor::from_vector<float>(
      {0.5f, -1, 2, 0.25f, 3, 1, -2, 0, 1.5f, 1.5f, -0.5f, 4}, {3, 4});
  const Tensor targets = Tensor::from_vector<int64_t>({2, 0, 3}, {3});
  Tensor w = whole.clone();
  w.set_requires_grad(true);
  Tensor loss = cross_entropy(w, targets);
  loss.backward();
  const std::vector<float> want_grad = w.grad().to_vector<float>();
  std::vector<double> lse(3), picked(3, 0.0), most(3, -1e300);
  std::vector<std::vector<double>> parts_lse;
  for (int64_t first : {0, 2}) {
    const std::vector<Tensor> part = cross_entropy_part(narrow(whole, 1, first, 2), targets, first);
    parts_lse.push_back(part[0].to_vector<double>());
    const std::vector<double> p = part[1].to_vector<double>();
    for (size_t r = 0; r < 3; ++r) {
      picked[r] += p[r];
      most[r] = std::max(most[r], parts_lse.back()[r]);
    }
  }
  EXPECT_EQ(picked, (std::vector<double>{2, 3, 4}));  // each target's logit, from its part
  double mean = 0;
  for (size_t r = 0; r < 3; ++r) {
    lse[r] = most[r] + std::log(std::exp(parts_lse[0][r] - most[r]) +
                                std::exp(parts_lse[1][r] - most[r]));
    mean += (lse[r] - picked[r]) / 3;
  }
  EXPECT_NEAR(mean, loss.item(), 1e-6);
  const Tensor row_lse = Tensor::from_vector(lse, {3}).to(DType::F32);
  for (int64_t first : {0, 2}) {
    const std::vector<float> got =
        cross_entropy_part_backward(narrow(whole, 1, first, 2), targets, first, row_lse,
                                    Tensor::ones({}))
            .to_vector<float>();
    for (int64_t r = 0; r < 3; ++r)
      for (int64_t c = 0; c < 2; ++c)
        EXPECT_NEAR(got[static_cast<size_t>(r * 2 + c)],
                    want_grad[static_cast<size_t>(r * 4 + first + c)], 1e-6)
            << "row " << r << ", class " << first + c;
  }
}

// Floating operands of two dtypes compute in the wider, as PyTorch promotes them, and the
// narrower one's gradient comes back in its own dtype; on the CPU a bf16 op computes in f32
// and rounds once.
TEST(Tensor, FloatingDtypesPromoteAndBf16OpsRoundOnceOnTheCpu) {
  Tensor wide = Tensor::from_vector<double>({0.1, 0.2}, {2});
  Tensor narrow = Tensor::from_vector<float>({1.5f, -2.0f}, {2}).to(DType::BF16);
  wide.set_requires_grad(true);
  narrow.set_requires_grad(true);
  Tensor sum2 = add(wide, narrow);
  EXPECT_EQ(sum2.dtype(), DType::F64);
  EXPECT_EQ(sum2.to_vector<double>(), std::vector<double>({0.1 + 1.5, 0.2 - 2.0}));
  sum(mul(sum2, 3.0)).backward();
  EXPECT_EQ(narrow.grad().dtype(), DType::BF16);
  EXPECT_EQ(narrow.grad().to(DType::F32).to_vector<float>(), std::vector<float>({3, 3}));
  EXPECT_EQ(wide.grad().to_vector<double>(), std::vector<double>({3, 3}));

  // 256 + eight 1s: summed in bf16 one by one it stays 256 (bf16 steps by 2 there and each
  // tie rounds to even); summed in f32 and rounded once it is 264, as CUDA's kernel gives.
  std::vector<float> values(9, 1.0f);
  values[0] = 256.0f;
  Tensor column = Tensor::from_vector<float>(values, {9}).to(DType::BF16);
  EXPECT_EQ(sum(column).dtype(), DType::BF16);
  EXPECT_EQ(sum(column).to(DType::F32).item(), 264.0);
  EXPECT_EQ(sum(reshape(column, {9, 1}), {0}).to(DType::F32).to_vector<float>(),
            std::vector<float>({264.0f}));

  Tensor x = Tensor::from_vector<float>({-1.3f, 0.7f, 2.9f}, {3}).to(DType::BF16);
  EXPECT_EQ(gelu(x).dtype(), DType::BF16);
  EXPECT_EQ(gelu(x).to(DType::F32).to_vector<float>(),
            gelu(x.to(DType::F32)).to(DType::BF16).to(DType::F32).to_vector<float>());
}

// The ops a model with 16-bit weights runs outside autocast (ShardingOptions::weights_dtype)
// take bf16 and f16 on the CPU: each computes in f32 and rounds its result, and the gradients
// of its inputs, once.
TEST(Tensor, SixteenBitWeightsOpsRoundOnceOnTheCpu) {
  for (const DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    const auto values = [](int64_t n, double scale) {
      std::vector<float> v;
      for (int64_t i = 0; i < n; ++i)
        v.push_back(static_cast<float>(scale * std::sin(0.7 * double(i) + scale)));
      return v;
    };
    // Leaves in `low` and their f32 twins holding the same values.
    const auto leaf = [&](const Shape& shape, double scale) {
      Tensor t = Tensor::from_vector<float>(values(numel_of(shape), scale), shape).to(low);
      Tensor wide = t.to(DType::F32);
      t.set_requires_grad(true);
      wide.set_requires_grad(true);
      return std::pair{t, wide};
    };
    const auto rounded = [&](const Tensor& t) {
      return t.detach().to(low).to(DType::F32).to_vector<float>();
    };
    const auto widened = [](const Tensor& t) { return t.detach().to(DType::F32).to_vector<float>(); };
    auto [x, x32] = leaf({3, 8}, 1.0);
    auto [w, w32] = leaf({8}, 0.5);
    auto [b, b32] = leaf({8}, 0.25);
    auto [m, m32] = leaf({8, 5}, 0.3);
    auto [e, e32] = leaf({6, 8}, 0.8);
    auto [q, q32] = leaf({1, 2, 4, 4}, 0.9);
    const Tensor ids = Tensor::from_vector<int64_t>({5, 0, 5}, {3});
    const std::vector<std::pair<Tensor, Tensor>> outputs = {
        {layer_norm(x, w, b), layer_norm(x32, w32, b32)},
        {rms_norm(x, w, 1e-5), rms_norm(x32, w32, 1e-5)},
        {matmul(x, m), matmul(x32, m32)},
        {embedding(ids, e), embedding(ids, e32)},
        {causal_attention(q, q, q), causal_attention(q32, q32, q32)}};
    for (size_t i = 0; i < outputs.size(); ++i) {
      EXPECT_EQ(outputs[i].first.dtype(), low) << "op " << i;
      EXPECT_EQ(widened(outputs[i].first), rounded(outputs[i].second)) << "op " << i;
      sum(mul(outputs[i].first, 1.0)).backward();
      sum(mul(outputs[i].second, 1.0)).backward();
    }
    for (const auto& [t, t32] : std::vector<std::pair<Tensor, Tensor>>{
             {x, x32}, {w, w32}, {b, b32}, {m, m32}, {e, e32}}) {
      EXPECT_EQ(t.grad().dtype(), low);
      // Each op's gradient is rounded once, then the ops' gradients are summed in `low`.
      EXPECT_NEAR(widened(t.grad())[0], t32.grad().to_vector<float>()[0],
                  std::abs(t32.grad().to_vector<float>()[0]) * 2e-2 + 1e-2);
    }
  }
}

// bias_gelu, sum over dimensions and cross_entropy read bf16 and f16 on the CPU themselves,
// computing in f32 (kernels/cpu/widen.h): the bits of running the f32 ops on widened copies and
// rounding each result once, gradients included.
TEST(Tensor, SixteenBitKernelsGiveTheBitsOfTheWidenedF32Ops) {
  for (const DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    const auto filled = [low](const Shape& shape, double scale) {
      return sine_filled(shape, scale, 0.0).to(low);
    };
    const auto rounded = [low](const Tensor& t) { return t.detach().to(low); };
    // 33 rows (not a multiple of any vector width) of 20 columns.
    Tensor x = filled({3, 11, 20}, 2.5), bias = filled({20}, 0.5), dy = filled({3, 11, 20}, 1.5);
    Tensor x32 = x.to(DType::F32), bias32 = bias.to(DType::F32);
    x.set_requires_grad(true);
    bias.set_requires_grad(true);
    x32.set_requires_grad(true);
    bias32.set_requires_grad(true);
    Tensor y = bias_gelu(x, bias), y32 = bias_gelu(x32, bias32);
    EXPECT_EQ(y.dtype(), low);
    EXPECT_EQ(bits_of(y), bits_of(rounded(y32)));
    y.backward(dy);
    y32.backward(dy.to(DType::F32));
    EXPECT_EQ(x.grad().dtype(), low);
    EXPECT_EQ(bits_of(x.grad()), bits_of(rounded(x32.grad())));
    EXPECT_EQ(bits_of(bias.grad()), bits_of(rounded(bias32.grad())));

    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{
             {0}, {1}, {2}, {0, 1}, {0, 2}, {0, 1, 2}}) {
      Tensor s = sum(dy, dims);
      EXPECT_EQ(s.dtype(), low);
      EXPECT_EQ(bits_of(s), bits_of(rounded(sum(dy.to(DType::F32), dims))));
    }

    // cross_entropy's loss is f32 either way; its gradient is rounded once.
    Tensor logits = filled({5, 37}, 4.0), logits32 = logits.to(DType::F32);
    logits.set_requires_grad(true);
    logits32.set_requires_grad(true);
    const Tensor targets = Tensor::from_vector<int64_t>({3, 0, 36, 17, 3}, {5});
    Tensor loss = cross_entropy(logits, targets), loss32 = cross_entropy(logits32, targets);
    EXPECT_EQ(loss.dtype(), DType::F32);
    EXPECT_EQ(loss.item(), loss32.item());
    mul(loss, 3.0).backward();
    mul(loss32, 3.0).backward();
    EXPECT_EQ(logits.grad().dtype(), low);
    EXPECT_EQ(bits_of(logits.grad()), bits_of(rounded(logits32.grad())));
  }
}

// A norm with a 16-bit out_dtype (the input of autocast's products) gives the bits of the f32
// norm cast to that dtype, and from the same 16-bit output gradient the gradients of that
// cast's backward (widened) through the f32 norm: x's, weight's and bias's, bitwise.
TEST(Tensor, NormsWithA16BitOutputGiveTheBitsOfTheF32NormAndItsCast) {
  for (const DType low : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(low));
    // 33 rows of 20 columns; dy already in the low dtype, as autocast's products give it.
    const Tensor x0 = sine_filled({3, 11, 20}, 2.5, 0.3), w0 = sine_filled({20}, 0.5, 1.0),
                 b0 = sine_filled({20}, 0.5, 0.0), dy = sine_filled({3, 11, 20}, 1.5, 0.0).to(low);
    for (const bool rms : {false, true}) {
      SCOPED_TRACE(rms ? "rms_norm" : "layer_norm");
      const auto run = [&](bool fused) {
        Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true),
               b = b0.clone().set_requires_grad(true);
        Tensor y;
        if (fused) {
          y = rms ? rms_norm(x, w, 1e-5, low) : layer_norm(x, w, b, 1e-5, low);
        } else {
          y = cast(rms ? rms_norm(x, w, 1e-5) : layer_norm(x, w, b, 1e-5), low);
        }
        y.backward(dy);
        return std::vector<Tensor>{y, x.grad(), w.grad(), rms ? Tensor() : b.grad()};
      };
      const std::vector<Tensor> fused = run(true), composed = run(false);
      EXPECT_EQ(fused[0].dtype(), low);
      for (size_t i = 0; i < fused.size(); ++i) {
        if (!composed[i].defined()) continue;
        EXPECT_EQ(fused[i].dtype(), composed[i].dtype()) << "output " << i;
        EXPECT_EQ(bits_of(fused[i]), bits_of(composed[i])) << "output " << i;
      }
    }
  }
  // An output dtype the kernels cannot write is a named error.
  const Tensor x = Tensor::ones({2, 4}, DType::F64), w = Tensor::ones({4}, DType::F64);
  try {
    layer_norm(x, w, Tensor::zeros({4}, DType::F64), 1e-5, DType::BF16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_norm: out_dtype bf16 for an input of f64"),
              std::string::npos)
        << e.what();
  }
}

// The residual add and the norm in one pass where an f32 stream meets a 16-bit branch and the
// norm writes 16 bits (a GPT-2 block's second half under autocast, a Llama layer's): the bits
// of add, then layer_norm (rms_norm) with that out_dtype, and of their backward: x's f32
// gradient, the branch's in its dtype, the parameters'. Also an f32 branch (a tensor-parallel
// one, its f32 bias added after the reduction) before the 16-bit output.
TEST(Tensor, AddNormsOfAnF32StreamAndA16BitBranchGiveTheBitsOfTheirTwoOps) {
  struct Case {
    DType low;
    bool rms, f32_branch;
  };
  for (const Case& c : std::vector<Case>{{DType::BF16, false, false}, {DType::F16, false, false},
                                         {DType::BF16, true, false}, {DType::BF16, false, true},
                                         {DType::F16, true, true}}) {
    const DType low = c.low;  // not structured bindings: clang 14 cannot capture those
    const bool rms = c.rms, f32_branch = c.f32_branch;
    SCOPED_TRACE(std::string(dtype_name(low)) + (rms ? " add_rms_norm" : " add_layer_norm") +
                 (f32_branch ? ", f32 branch" : ""));
    const Tensor x0 = sine_filled({3, 11, 20}, 2.5, 0.3, 0.41),
                 branch0 =
                     sine_filled({3, 11, 20}, 1.0, 0.1, 0.41).to(f32_branch ? DType::F32 : low),
                 w0 = sine_filled({20}, 0.5, 1.0, 0.41), b0 = sine_filled({20}, 0.5, 0.0, 0.41),
                 dnormed = sine_filled({3, 11, 20}, 1.5, 0.0, 0.41).to(low),
                 dsum = sine_filled({3, 11, 20}, 0.7, 0.0, 0.41);
    const auto run = [&](bool fused) {
      Tensor x = x0.clone().set_requires_grad(true),
             branch = branch0.clone().set_requires_grad(true),
             w = w0.clone().set_requires_grad(true), b = b0.clone().set_requires_grad(true);
      AddNorm h;
      if (fused) {
        h = rms ? add_rms_norm(x, branch, w, 1e-5, low)
                : add_layer_norm(x, branch, w, b, 1e-5, low);
      } else {
        h.sum = add(x, branch);
        h.normed = rms ? rms_norm(h.sum, w, 1e-5, low) : layer_norm(h.sum, w, b, 1e-5, low);
      }
      add(sum(mul(h.sum, dsum)), sum(mul(h.normed.to(DType::F32), dnormed.to(DType::F32))))
          .backward();
      return std::vector<Tensor>{h.sum, h.normed, x.grad(), branch.grad(), w.grad(),
                                 rms ? Tensor() : b.grad()};
    };
    const std::vector<Tensor> fused = run(true), composed = run(false);
    EXPECT_EQ(fused[1].dtype(), low);
    EXPECT_EQ(fused[3].dtype(), f32_branch ? DType::F32 : low);
    for (size_t i = 0; i < fused.size(); ++i) {
      if (!composed[i].defined()) continue;
      EXPECT_EQ(fused[i].dtype(), composed[i].dtype()) << "output " << i;
      EXPECT_EQ(bits_of(fused[i]), bits_of(composed[i])) << "output " << i;
    }
  }
}

// The norms that keep or end a residual stream take over the add in front of them where it is an
// f32 stream plus a 16-bit branch (Note [A norm takes over the residual add before it]): the
// bits of the ops apart, forward and backward (the stream's values and gradient, the norm's
// output, both operands' gradients, the branch's in its dtype, the parameters'). Also after a
// tensor that is no such add (the stream's gradient still added in the norm's pass).
TEST(Tensor, NormsKeepingOrEndingTheStreamGiveTheBitsOfTheOpsApart) {
  struct Case {
    DType low;
    bool rms, after_add, ending;
  };
  for (const Case& c : std::vector<Case>{{DType::BF16, false, true, false},
                                         {DType::F16, false, true, false},
                                         {DType::BF16, true, true, false},
                                         {DType::BF16, false, false, false},
                                         {DType::BF16, false, true, true},
                                         {DType::F16, true, true, true}}) {
    const DType low = c.low;  // not structured bindings: clang 14 cannot capture those
    const bool rms = c.rms, after_add = c.after_add, ending = c.ending;
    SCOPED_TRACE(std::string(dtype_name(low)) + (rms ? " rms_norm" : " layer_norm") +
                 (ending ? " ending" : " keeping") + (after_add ? " after an add" : ""));
    const Tensor x0 = sine_filled({3, 7, 24}, 2.5, 0.3),
                 branch0 = sine_filled({3, 7, 24}, 1.0, 0.1).to(low),
                 w0 = sine_filled({24}, 0.5, 1.0), b0 = sine_filled({24}, 0.5, 0.0),
                 dnormed = sine_filled({3, 7, 24}, 1.5, 0.0).to(low),
                 dstream = sine_filled({3, 7, 24}, 0.7, 0.0);
    const auto run = [&](bool together) {
      Tensor x = x0.clone().set_requires_grad(true),
             branch = branch0.clone().set_requires_grad(true),
             w = w0.clone().set_requires_grad(true), b = b0.clone().set_requires_grad(true);
      const Tensor in = after_add ? add(x, branch) : x;
      Tensor stream = in, normed;
      if (!together) {
        normed = rms ? rms_norm(in, w, 1e-5, low) : layer_norm(in, w, b, 1e-5, low);
      } else if (ending) {
        normed = rms ? rms_norm_ending_stream(in, w, 1e-5, low)
                     : layer_norm_ending_stream(in, w, b, 1e-5, low);
      } else {
        const AddNorm kept = rms ? rms_norm_keeping_stream(in, w, 1e-5, low)
                                 : layer_norm_keeping_stream(in, w, b, 1e-5, low);
        stream = kept.sum;
        normed = kept.normed;
      }
      Tensor loss = sum(mul(normed.to(DType::F32), dnormed.to(DType::F32)));
      if (!ending) loss = add(loss, sum(mul(stream, dstream)));
      loss.backward();
      return std::vector<Tensor>{stream, normed, x.grad(),
                                 after_add ? branch.grad() : Tensor(), w.grad(),
                                 rms ? Tensor() : b.grad()};
    };
    const std::vector<Tensor> together = run(true), apart = run(false);
    for (size_t i = 0; i < together.size(); ++i) {
      if (!apart[i].defined()) continue;
      ASSERT_TRUE(together[i].defined()) << "output " << i;
      EXPECT_EQ(together[i].dtype(), apart[i].dtype()) << "output " << i;
      EXPECT_EQ(bits_of(together[i]), bits_of(apart[i])) << "output " << i;
    }
  }
}

// sum's dtype= (PyTorch's): a 16-bit tensor summed into f32 keeps the f32 sums (their rounding
// is the 16-bit sum's); any other change of dtype is an error that says what sum takes.
TEST(Tensor, SumIntoF32KeepsTheSumsA16BitSumRounds) {
  const Tensor x = Tensor::from_vector<float>({1.0f, 0.00390625f, 0.00390625f, 3.0f}, {2, 2})
                       .to(DType::BF16);  // 1 + 2^-8 is no bf16 value: the bf16 sum rounds it
  const Tensor wide = sum(x, {0}, false, DType::F32);
  EXPECT_EQ(wide.dtype(), DType::F32);
  EXPECT_EQ(wide.to_vector<float>(), std::vector<float>({1.00390625f, 3.00390625f}));
  EXPECT_EQ(sum(x, {0}).to(DType::F32).to_vector<float>(), std::vector<float>({1.0f, 3.0f}));
  EXPECT_EQ(wide.to(DType::BF16).to(DType::F32).to_vector<float>(),
            sum(x, {0}).to(DType::F32).to_vector<float>());
  try {
    sum(x.to(DType::F32), {0}, false, DType::BF16);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum: a f32 tensor is summed in f32, got dtype bf16"),
              std::string::npos)
        << e.what();
  }
}

TEST(Tensor, ExactValuesOfCoreOps) {
  Tensor a = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  EXPECT_EQ(matmul(a, b).to_vector<float>(), std::vector<float>({4, 5, 10, 11}));
  EXPECT_EQ(sum(a, {0}).to_vector<float>(), std::vector<float>({5, 7, 9}));
  EXPECT_EQ(max(a, 1).to_vector<float>(), std::vector<float>({3, 6}));
  EXPECT_EQ(sum(a).item(), 21);
  EXPECT_EQ(concat({a, a}, 0).shape(), Shape({4, 3}));
  // softmax of equal logits is uniform; cross-entropy of uniform logits is log(V).
  Tensor logits = Tensor::zeros({2, 4});
  EXPECT_EQ(softmax(logits).to_vector<float>(), std::vector<float>(8, 0.25f));
  Tensor ce = cross_entropy(logits.to(DType::F64), Tensor::from_vector<int64_t>({1, 3}, {2}));
  EXPECT_NEAR(ce.item(), std::log(4.0), 1e-15);
}

TEST(Tensor, Fp32TranscendentalsAreAccurate) {
  std::vector<float> xs;
  for (int i = -400; i <= 400; ++i)
    xs.push_back(static_cast<float>(i) / 40.0f);
  Tensor x = Tensor::from_vector(xs, {static_cast<int64_t>(xs.size())});
  std::vector<float> y = gelu(x).to_vector<float>();
  for (size_t i = 0; i < xs.size(); ++i) {
    double v = xs[i];
    double expected = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(y[i], expected, 2e-6 * (1 + std::abs(expected))) << v;
  }
}

// A diverged run's NaN goes through the fp32 exp (softmax, GELU) and comes out NaN; the exp's
// scale no longer converts NaN to an integer (undefined behaviour that clang's UBSan stops at).
TEST(Tensor, Fp32TranscendentalsPassNanThrough) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = Tensor::from_vector(std::vector<float>{nan, 0.0f, nan, 1.0f}, {2, 2});
  std::vector<float> g = gelu(x).to_vector<float>();
  EXPECT_TRUE(std::isnan(g[0]) && std::isnan(g[2]));
  EXPECT_EQ(g[1], 0.0f);
  std::vector<float> p = softmax(x).to_vector<float>();
  EXPECT_TRUE(std::isnan(p[0]) && std::isnan(p[1]) && std::isnan(p[2]) && std::isnan(p[3]));
}

}  // namespace
}  // namespace loom
