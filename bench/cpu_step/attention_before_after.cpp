// The CPU attention kernel before (kernels/cpu/attention.cpp at an older commit, which kept the
// [B, H, T, T] probabilities) and now (flash-style), interleaved on the same inputs: q, k and v
// as views of a fused [B, T, 3, H, D] projection as GPT's are; 8 repetitions after a warm-up, the
// median of each. Built and run by attention_before_after.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "old_attention.h"  // the previous kernel, namespace old (attention_before_after.sh)
namespace cpu = loom::kernels::cpu;
using clk = std::chrono::steady_clock;
int main() {
  struct S { int64_t b, h, t, d; };
  const S shapes[] = {{8, 4, 128, 32}, {8, 6, 256, 64}, {2, 12, 512, 64}, {2, 12, 1024, 64}};
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    for (const S& s : shapes) {
      const int64_t hd = s.h * s.d, n = s.b * s.t * 3 * hd, m = s.b * s.t * hd;
      std::vector<float> qkv(n), dout(m), out(m), dq(m), dk(m), dv(m), lse(s.b * s.h * s.t),
          probs(s.b * s.h * s.t * s.t);
      std::mt19937 rng(1);
      std::normal_distribution<float> nd;
      for (auto& x : qkv) x = nd(rng);
      for (auto& x : dout) x = nd(rng);
      const int64_t fused[3] = {s.t * 3 * hd, s.d, 3 * hd}, plain[3] = {s.t * hd, s.d, hd};
      const float *q = qkv.data(), *k = q + hd, *v = q + 2 * hd;
      std::vector<double> tf_old, tf_new, tb_old, tb_new;
      for (int rep = 0; rep < 9; ++rep) {
        auto t0 = clk::now();
        cpu::old::causal_attention_forward<float>({s.b, s.h, s.t, s.d}, q, fused, k, fused, v, fused, out.data(), plain, probs.data());
        auto t1 = clk::now();
        cpu::old::causal_attention_backward<float>({s.b, s.h, s.t, s.d}, dout.data(), plain, q, fused, k, fused, v, fused, probs.data(), dq.data(), plain, dk.data(), plain, dv.data(), plain);
        auto t2 = clk::now();
        const cpu::AttentionShape ns{s.b, s.h, s.t, s.d, s.h};
        cpu::causal_attention_forward<float>(ns, q, fused, k, fused, v, fused, out.data(), plain, lse.data());
        auto t3 = clk::now();
        cpu::causal_attention_backward<float>(ns, dout.data(), plain, q, fused, k, fused, v, fused, out.data(), plain, lse.data(), dq.data(), plain, dk.data(), plain, dv.data(), plain);
        auto t4 = clk::now();
        if (rep == 0) continue;
        auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
        tf_old.push_back(ms(t0, t1)); tb_old.push_back(ms(t1, t2));
        tf_new.push_back(ms(t2, t3)); tb_new.push_back(ms(t3, t4));
      }
      auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
      const double flops = 4.0 * s.b * s.h * s.t * (s.t + 1) / 2 * s.d;  // causal fwd
      std::printf("threads %d B%lld H%lld T%lld D%lld | fwd old %.2f new %.2f ms (%.2f) | bwd old %.2f new %.2f ms (%.2f) | new fwd %.1f bwd(2x) %.1f GFLOP/s\n",
                  threads, (long long)s.b, (long long)s.h, (long long)s.t, (long long)s.d,
                  med(tf_old), med(tf_new), med(tf_new) / med(tf_old), med(tb_old), med(tb_new),
                  med(tb_new) / med(tb_old), flops / med(tf_new) * 1e-6, 2 * flops / med(tb_new) * 1e-6);
    }
  }
}
