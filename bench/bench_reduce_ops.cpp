// The communication layer's reduction kernels (kernels/cpu/reduce_ops.h) against memcpy of the
// same bytes. Each is checked bit for bit against a plain scalar loop before it is timed.
// "bytes" is the size of one buffer; GB/s counts every byte read and written.
//
//   build/red/bench/loom_bench --benchmark_filter='Reduce|Memcpy' --benchmark_min_time=0.2

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "bench/roofline.h"
#include "bench/validate.h"
#include "kernels/cpu/reduce_ops.h"
#include "kernels/cpu/reduce_ops_impl.h"

namespace loom::bench {
namespace {

using kernels::cpu::ReduceKind;

using Bf16 = uint16_t;  // bf16 bits; the alias names the benchmarks

float bf16_to_float(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

uint16_t float_to_bf16(float x) {  // nearest even; the data here has no NaN
  uint32_t u = std::bit_cast<uint32_t>(x);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// A buffer of `bytes` holding values in [-1, 1) of type T (float or Bf16).
template <typename T>
std::vector<T> random_buffer(size_t bytes, uint64_t seed) {
  std::vector<T> v(bytes / sizeof(T));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (T& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
    float f = static_cast<float>(static_cast<int32_t>(s >> 32)) * 0x1p-31f;
    if constexpr (sizeof(T) == 4) {
      x = f;
    } else {
      x = float_to_bf16(f);
    }
  }
  return v;
}

template <typename T>
float value(T x) {
  if constexpr (sizeof(T) == 4) {
    return x;
  } else {
    return bf16_to_float(x);
  }
}

// The scalar reference: sum in f32 left to right, one rounding to T.
template <typename T>
std::vector<float> reference_sum(const std::vector<std::vector<T>>& inputs) {
  std::vector<float> want(inputs[0].size());
  for (size_t i = 0; i < want.size(); ++i) {
    float acc = value(inputs[0][i]);
    for (size_t j = 1; j < inputs.size(); ++j)
      acc += value(inputs[j][i]);
    if constexpr (sizeof(T) == 4) {
      want[i] = acc;
    } else {
      want[i] = bf16_to_float(float_to_bf16(acc));
    }
  }
  return want;
}

template <typename T>
std::vector<float> values(const std::vector<T>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    f[i] = value(v[i]);
  return f;
}

template <typename T>
constexpr DType reduce_type() {
  return sizeof(T) == 4 ? DType::F32 : DType::BF16;
}

// dst += src in place (the ring allreduce's step): reads 2 buffers, writes 1.
template <typename T>
void reduce_into_case(benchmark::State& state, size_t bytes) {
  std::vector<T> dst = random_buffer<T>(bytes, 1), src = random_buffer<T>(bytes, 2);
  {
    std::vector<T> got = dst;
    kernels::cpu::reduce_into(reduce_type<T>(), ReduceKind::Sum, got.data(), src.data(),
                              got.size());
    if (!validated(state, compare(values(got), reference_sum<T>({dst, src})), 0)) return;
  }
  for (auto _ : state) {
    kernels::cpu::reduce_into(reduce_type<T>(), ReduceKind::Sum, dst.data(), src.data(),
                              dst.size());
    benchmark::ClobberMemory();
  }
  state.SetLabel(kernels::cpu::reduce_isa());
  state.counters["GB/s"] =
      benchmark::Counter(3.0 * bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_working_set(state, 2.0 * bytes);
}

template <typename T>
void BM_ReduceInto(benchmark::State& state) {
  reduce_into_case<T>(state, state.range(0));
}

// out = in0 + ... + in{count-1} into a separate buffer: reads count buffers, writes 1.
template <typename T>
void BM_ReduceInputs(benchmark::State& state) {
  size_t bytes = state.range(0), count = state.range(1);
  std::vector<std::vector<T>> inputs;
  std::vector<const void*> ptrs;
  for (size_t j = 0; j < count; ++j)
    inputs.push_back(random_buffer<T>(bytes, 10 + j));
  for (const auto& in : inputs)
    ptrs.push_back(in.data());
  std::vector<T> out(bytes / sizeof(T));
  kernels::cpu::reduce_inputs(reduce_type<T>(), ReduceKind::Sum, out.data(), ptrs.data(), count,
                              out.size());
  if (!validated(state, compare(values(out), reference_sum(inputs)), 0)) return;
  for (auto _ : state) {
    kernels::cpu::reduce_inputs(reduce_type<T>(), ReduceKind::Sum, out.data(), ptrs.data(), count,
                                out.size());
    benchmark::ClobberMemory();
  }
  state.SetLabel(kernels::cpu::reduce_isa());
  state.counters["GB/s"] = benchmark::Counter((count + 1.0) * bytes * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  set_working_set(state, (count + 1.0) * bytes);
}

// reduce_into with the instruction set forced: 0 scalar, 1 avx2, 2 avx512.
template <typename T>
void BM_ReduceIntoIsa(benchmark::State& state) {
  constexpr const char* kIsas[] = {"scalar", "avx2", "avx512"};
  const char* isa = kIsas[state.range(1)];
  if (!kernels::cpu::reduce_isa_available(isa)) {
    state.SkipWithError("instruction set not available on this machine");
    return;
  }
  kernels::cpu::set_reduce_isa_for_testing(isa);
  reduce_into_case<T>(state, state.range(0));
  kernels::cpu::set_reduce_isa_for_testing(nullptr);
}

// The peer: the same bytes through memcpy (reads 1 buffer, writes 1).
void BM_Memcpy(benchmark::State& state) {
  size_t bytes = state.range(0);
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(2.0 * bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  set_working_set(state, 2.0 * bytes);
}

constexpr int64_t kSizes[] = {32 << 10, 1 << 20, 16 << 20, 64 << 20};

void sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes"});
  for (int64_t s : kSizes)
    b->Arg(s);
  b->Unit(benchmark::kMicrosecond);
}

void sizes_and_counts(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "count"});
  for (int64_t count : {2, 4, 8}) {
    for (int64_t s : kSizes)
      b->Args({s, count});
  }
  b->Unit(benchmark::kMicrosecond);
}

void sizes_and_isas(benchmark::internal::Benchmark* b) {
  b->ArgNames({"bytes", "isa"});
  for (int64_t isa : {0, 1, 2}) {
    for (int64_t s : {int64_t{32 << 10}, int64_t{16 << 20}})
      b->Args({s, isa});
  }
  b->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_Memcpy)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_ReduceInto, float)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_ReduceInto, Bf16)->Apply(sizes);
BENCHMARK_TEMPLATE(BM_ReduceInputs, float)->Apply(sizes_and_counts);
BENCHMARK_TEMPLATE(BM_ReduceInputs, Bf16)->Apply(sizes_and_counts);
BENCHMARK_TEMPLATE(BM_ReduceIntoIsa, float)->Apply(sizes_and_isas);
BENCHMARK_TEMPLATE(BM_ReduceIntoIsa, Bf16)->Apply(sizes_and_isas);

}  // namespace
}  // namespace loom::bench
