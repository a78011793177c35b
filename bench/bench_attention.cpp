// Fused causal attention, forward and forward+backward, against a composed-op reference.

#include "bench/validate.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::bench {
namespace {

struct Qkv {
  Tensor q, k, v;
};

Qkv random_qkv(int64_t b, int64_t h, int64_t t, int64_t d, bool requires_grad) {
  Generator gen(4);
  Qkv x{Tensor::empty({b, h, t, d}), Tensor::empty({b, h, t, d}), Tensor::empty({b, h, t, d})};
  for (Tensor* p : {&x.q, &x.k, &x.v}) {
    normal_(*p, 0, 1, gen);
    if (requires_grad) p->set_requires_grad(true);
  }
  return x;
}

// 4*B*H*T*T*D multiply-adds counted as the dense (unmasked) work of QK^T and PV.
double attention_flops(int64_t b, int64_t h, int64_t t, int64_t d) {
  return 4.0 * b * h * t * t * d;
}

void BM_CausalAttentionForward(benchmark::State& state) {
  int64_t b = state.range(0), h = state.range(1), t = state.range(2), d = state.range(3);
  Qkv x = random_qkv(b, h, t, d, false);
  Tensor composed;
  {
    // The reference in f64 through separate ops: softmax(QK^T/sqrt(D), causal) V.
    Tensor q = x.q.to(DType::F64), k = x.k.to(DType::F64), v = x.v.to(DType::F64);
    composed =
        matmul(softmax(mul(matmul(q, transpose(k, -1, -2)), 1.0 / std::sqrt(double(d))), true), v);
  }
  if (!validated(state,
                 compare(causal_attention(x.q, x.k, x.v).contiguous().to_vector<float>(),
                         composed.to_vector<double>()),
                 1e-5)) {
    return;
  }
  for (auto _ : state)
    benchmark::DoNotOptimize(causal_attention(x.q, x.k, x.v));
  state.counters["GFLOP/s"] = benchmark::Counter(attention_flops(b, h, t, d) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_CausalAttentionForwardBackward(benchmark::State& state) {
  int64_t b = state.range(0), h = state.range(1), t = state.range(2), d = state.range(3);
  Qkv x = random_qkv(b, h, t, d, true);
  Tensor dy = Tensor::ones({b, h, t, d});
  // Reference: the value gradient of sum(out) is column sums of P, i.e. dV[j] = sum_i P[i,j],
  // and since rows of P sum to 1, the total of dV over time is T per (b, h, d).
  causal_attention(x.q, x.k, x.v).backward(dy);
  Tensor total = sum(x.v.grad(), {2});
  if (!validated(state,
                 compare(total.to_vector<float>(), std::vector<double>(b * h * d, double(t))),
                 1e-3)) {
    return;
  }
  for (auto _ : state)
    causal_attention(x.q, x.k, x.v).backward(dy);
  state.counters["GFLOP/s"] = benchmark::Counter(3.0 * attention_flops(b, h, t, d) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

// The GPT shapes of bench/cpu_step/size_sweep.sh: 0.8M, 10.7M (also 4 x 12 x 256, GPT-2's heads)
// and GPT-2 small's 124M at ctx 512 and 1024.
BENCHMARK(BM_CausalAttentionForward)
    ->ArgNames({"B", "H", "T", "D"})
    ->Args({8, 4, 128, 32})
    ->Args({8, 6, 256, 64})
    ->Args({4, 12, 256, 64})
    ->Args({2, 12, 512, 64})
    ->Args({2, 12, 1024, 64})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CausalAttentionForwardBackward)
    ->ArgNames({"B", "H", "T", "D"})
    ->Args({8, 4, 128, 32})
    ->Args({8, 6, 256, 64})
    ->Args({2, 12, 512, 64})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace loom::bench
