// kernels/cuda/attention.cu under the emulator against kernels/cpu/attention: v1 (SIMT, f32
// and bf16), v2 (WMMA tensor cores, bf16) and v3 (mma.sync in registers, bf16) forward and
// backward, on head dims padded and
// not, sequence lengths around the tiles, grouped-query and multi-query heads, and q/k/v as
// strided views into a fused [B, T, H + 2 H_kv, D] projection; bitwise the same under every
// schedule.

#include "kernels/cuda/attention.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "core/tunables.h"
#include "emulation_test_util.h"
#include "kernels/cpu/attention.h"
#include "runtime/work_log.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

struct Shape {
  int64_t batch, heads, time, head_dim, kv_heads;
};
// Multi-head, then grouped-query (Llama's 2 query heads per key/value head, SmolLM's 3, across
// tiles of every version) and multi-query; T = 150 puts v3's 128-row forward blocks (head dims
// up to 64) past the first, with key tiles below, across and on the diagonal.
const Shape kShapes[] = {{1, 1, 5, 8, 1},   {2, 3, 17, 32, 3},  {1, 2, 33, 40, 2},
                         {1, 1, 70, 64, 1}, {1, 1, 65, 128, 1}, {2, 1, 100, 24, 1},
                         {2, 4, 17, 32, 2}, {1, 6, 70, 64, 2},  {1, 3, 33, 40, 1},
                         {1, 2, 150, 32, 1}};

std::string describe(const Shape& s) {
  return "B " + std::to_string(s.batch) + " H " + std::to_string(s.heads) + " H_kv " +
         std::to_string(s.kv_heads) + " T " + std::to_string(s.time) + " D " +
         std::to_string(s.head_dim);
}

// q, k, v inside one fused projection buffer [B, T, H + 2 H_kv, D]; out, dout, dq contiguous
// [B, H, T, D], dk and dv [B, H_kv, T, D].
struct Layouts {
  int64_t fused[3], plain[3], plain_kv[3];
  size_t fused_size, plain_size, plain_kv_size;
  int64_t k_offset, v_offset;
};

Layouts layouts(const Shape& s) {
  const int64_t row = (s.heads + 2 * s.kv_heads) * s.head_dim;
  Layouts l{};
  l.fused[0] = s.time * row;
  l.fused[1] = s.head_dim;
  l.fused[2] = row;
  l.plain[0] = s.heads * s.time * s.head_dim;
  l.plain[1] = s.time * s.head_dim;
  l.plain[2] = s.head_dim;
  l.plain_kv[0] = s.kv_heads * s.time * s.head_dim;
  l.plain_kv[1] = s.time * s.head_dim;
  l.plain_kv[2] = s.head_dim;
  l.fused_size = static_cast<size_t>(s.batch * s.time * row);
  l.plain_size = static_cast<size_t>(s.batch * s.heads * s.time * s.head_dim);
  l.plain_kv_size = static_cast<size_t>(s.batch * s.kv_heads * s.time * s.head_dim);
  l.k_offset = s.heads * s.head_dim;
  l.v_offset = (s.heads + s.kv_heads) * s.head_dim;
  return l;
}

// One version's forward, then its backward from that forward's output and log-sum-exp, on q, k
// and v inside `qkv` (layouts(s)) and `dout`.
template <typename T>
struct Attended {
  std::vector<T> out, dq, dk, dv;
  std::vector<float> lse;
};

template <typename T>
Attended<T> attend(gpu::AttentionVersion version, const Shape& s, const std::vector<T>& qkv,
                   const std::vector<T>& dout) {
  const Layouts l = layouts(s);
  const gpu::AttentionShape gs{s.batch, s.heads, s.time, s.head_dim, s.kv_heads};
  Attended<T> r{std::vector<T>(l.plain_size), std::vector<T>(l.plain_size),
                std::vector<T>(l.plain_kv_size), std::vector<T>(l.plain_kv_size),
                std::vector<float>(static_cast<size_t>(s.batch * s.heads * s.time))};
  gpu::flash_attention_forward_version(version, dtype_of<T>(), gs, qkv.data(), l.fused,
                                       qkv.data() + l.k_offset, l.fused, qkv.data() + l.v_offset,
                                       l.fused, r.out.data(), l.plain, r.lse.data(), nullptr);
  std::vector<float> workspace(gpu::flash_attention_backward_workspace(gs) / 4 + 4);
  gpu::flash_attention_backward_version(version, dtype_of<T>(), gs, dout.data(), l.plain,
                                        qkv.data(), l.fused, qkv.data() + l.k_offset, l.fused,
                                        qkv.data() + l.v_offset, l.fused, r.out.data(), l.plain,
                                        r.lse.data(), r.dq.data(), l.plain, r.dk.data(), l.plain_kv,
                                        r.dv.data(), l.plain_kv, workspace.data(), nullptr);
  return r;
}

template <typename T>
void check_attention(gpu::AttentionVersion version, double tol_out, double tol_grad) {
  ASSERT_TRUE(gpu::attention_version_supports(version, dtype_of<T>()));
  std::mt19937_64 rng(83);
  for (const auto& s : kShapes) {
    SCOPED_TRACE(describe(s));
    const Layouts l = layouts(s);
    const auto qkv = random_values<T>(l.fused_size, rng, -1, 1);
    const auto dout = random_values<T>(l.plain_size, rng, -1, 1);
    const auto qkv_w = widen_all(qkv), dout_w = widen_all(dout);
    const cpu::AttentionShape cs{s.batch, s.heads, s.time, s.head_dim, s.kv_heads};
    std::vector<float> want_out(l.plain_size), want_lse(static_cast<size_t>(s.batch * s.heads * s.time));
    std::vector<float> want_dq(l.plain_size), want_dk(l.plain_kv_size), want_dv(l.plain_kv_size);
    cpu::causal_attention_forward(cs, qkv_w.data(), l.fused, qkv_w.data() + l.k_offset, l.fused,
                                  qkv_w.data() + l.v_offset, l.fused, want_out.data(), l.plain,
                                  want_lse.data());
    cpu::causal_attention_backward(
        cs, dout_w.data(), l.plain, qkv_w.data(), l.fused, qkv_w.data() + l.k_offset, l.fused,
        qkv_w.data() + l.v_offset, l.fused, want_out.data(), l.plain, want_lse.data(),
        want_dq.data(), l.plain, want_dk.data(), l.plain_kv, want_dv.data(), l.plain_kv);
    std::vector<T> first_dq, first_dk;
    for_each_schedule([&] {
      const Attended<T> r = attend(version, s, qkv, dout);
      EXPECT_LE(max_relative_error(r.out, want_out), tol_out);
      EXPECT_LE(max_relative_error(r.lse, want_lse), tol_out);
      EXPECT_LE(max_relative_error(r.dq, want_dq), tol_grad);
      EXPECT_LE(max_relative_error(r.dk, want_dk), tol_grad);
      EXPECT_LE(max_relative_error(r.dv, want_dv), tol_grad);
      if (first_dq.empty()) {
        first_dq = r.dq;
        first_dk = r.dk;
      }
      EXPECT_TRUE(bitwise_equal(first_dq, r.dq)) << "attention gradients must be reproducible";
      EXPECT_TRUE(bitwise_equal(first_dk, r.dk)) << "attention gradients must be reproducible";
    });
  }
}

// Errors are relative to max(|x|, 1): f32 differs from the CPU's GEMM order by rounding;
// bf16 rounds inputs, probabilities (v2) and outputs to 8 bits of mantissa.
TEST(EmulatedAttention, SimtF32) {
  check_attention<float>(gpu::AttentionVersion::kSimt, 2e-6, 1e-5);
}
TEST(EmulatedAttention, SimtBf16) {
  check_attention<__nv_bfloat16>(gpu::AttentionVersion::kSimt, 8e-3, 2e-2);
}
TEST(EmulatedAttention, TensorCoreBf16) {
  check_attention<__nv_bfloat16>(gpu::AttentionVersion::kTensorCore, 8e-3, 2e-2);
}
TEST(EmulatedAttention, MmaBf16) {
  check_attention<__nv_bfloat16>(gpu::AttentionVersion::kMma, 8e-3, 2e-2);
}

// v3 keeps v2's arithmetic (P and dS rounded to bf16 before their products, the denominator
// summed from the rounded weights), so the two give the same bf16 outputs and gradients on
// these shapes: a change to either that alters a result shows here. The f32 log-sum-exp
// differs in its last bits where a row meets several key tiles: v2 adds each tile's sum to
// the running denominator, v3 each weight to its lane's share. (v3's exp2 also flushes
// results under 2^-126 to zero; no score here is that far below its row's max.)
TEST(EmulatedAttention, MmaGivesTheTensorCoreVersionsBits) {
  using T = __nv_bfloat16;
  std::mt19937_64 rng(97);
  for (const auto& s : kShapes) {
    SCOPED_TRACE(describe(s));
    const Layouts l = layouts(s);
    const auto qkv = random_values<T>(l.fused_size, rng, -3, 3);
    const auto dout = random_values<T>(l.plain_size, rng, -1, 1);
    const Attended<T> v2 = attend(gpu::AttentionVersion::kTensorCore, s, qkv, dout);
    const Attended<T> v3 = attend(gpu::AttentionVersion::kMma, s, qkv, dout);
    EXPECT_TRUE(bitwise_equal(v3.out, v2.out));
    EXPECT_LE(max_relative_error(v3.lse, v2.lse), 1e-6);
    EXPECT_TRUE(bitwise_equal(v3.dq, v2.dq));
    EXPECT_TRUE(bitwise_equal(v3.dk, v2.dk));
    EXPECT_TRUE(bitwise_equal(v3.dv, v2.dv));
  }
}

// The public launchers pick v1 for f32 and, on a device that runs sm_80 code (the emulated
// one reports sm_90), v3 for bf16.
template <typename T>
void check_public_launcher_is(gpu::AttentionVersion version) {
  const Shape s{1, 2, 40, 32, 2};
  const Layouts l = layouts(s);
  std::mt19937_64 rng(89);
  const auto qkv = random_values<T>(l.fused_size, rng, -1, 1);
  const gpu::AttentionShape gs{s.batch, s.heads, s.time, s.head_dim, s.kv_heads};
  std::vector<T> out(l.plain_size), want(l.plain_size);
  std::vector<float> lse(static_cast<size_t>(s.heads * s.time)), want_lse(lse.size());
  gpu::flash_attention_forward(dtype_of<T>(), gs, qkv.data(), l.fused, qkv.data() + l.k_offset,
                               l.fused, qkv.data() + l.v_offset, l.fused, out.data(), l.plain,
                               lse.data(), nullptr);
  gpu::flash_attention_forward_version(version, dtype_of<T>(), gs, qkv.data(), l.fused,
                                       qkv.data() + l.k_offset, l.fused, qkv.data() + l.v_offset,
                                       l.fused, want.data(), l.plain, want_lse.data(), nullptr);
  EXPECT_TRUE(bitwise_equal(out, want));
  EXPECT_TRUE(bitwise_equal(lse, want_lse));
}

TEST(EmulatedAttention, PublicLaunchersUseSimtForF32AndMmaForBf16) {
  check_public_launcher_is<float>(gpu::AttentionVersion::kSimt);
  check_public_launcher_is<__nv_bfloat16>(gpu::AttentionVersion::kMma);
}

// LOOM_CUDA_ATTENTION set for the scope, then restored.
class AttentionVersionVariable {
 public:
  explicit AttentionVersionVariable(const char* value) {
    if (const char* old = tunable_value(tunables::kCudaAttention)) saved_ = old;
    ::setenv(tunables::kCudaAttention.name, value, 1);
  }
  ~AttentionVersionVariable() {
    if (saved_) {
      ::setenv(tunables::kCudaAttention.name, saved_->c_str(), 1);
    } else {
      ::unsetenv(tunables::kCudaAttention.name);
    }
  }

 private:
  std::optional<std::string> saved_;
};

// The attention kernels the device ran, in order (their names as launched, less the template
// arguments): "attention_forward_mma", "attention_delta", ...
std::vector<std::string> attention_kernels(const WorkLog& log) {
  std::vector<std::string> names;
  for (const Work& w : log.entries())
    if (w.kind == WorkKind::kKernel) names.push_back(w.name.substr(0, w.name.find('<')));
  return names;
}

// LOOM_CUDA_ATTENTION picks bf16's version at each call, so that a GPU run can compare them
// with no rebuild; f32 stays on v1; a name it does not know is refused. The kernels the
// public launchers run show which version ran (v2 and v3 give the same outputs and gradients:
// MmaGivesTheTensorCoreVersionsBits).
TEST(EmulatedAttention, LoomCudaAttentionPicksTheBf16Version) {
  const Shape s{1, 2, 40, 32, 2};
  const Layouts l = layouts(s);
  std::mt19937_64 rng(89);
  const gpu::AttentionShape gs{s.batch, s.heads, s.time, s.head_dim, s.kv_heads};
  // The public launchers' forward and backward on random operands of type T.
  auto attend = [&]<typename T>() {
    const auto qkv = random_values<T>(l.fused_size, rng, -1, 1);
    const auto dout = random_values<T>(l.plain_size, rng, -1, 1);
    std::vector<T> out(l.plain_size), dq(l.plain_size), dk(l.plain_kv_size), dv(l.plain_kv_size);
    std::vector<float> lse(static_cast<size_t>(s.heads * s.time));
    std::vector<float> workspace(gpu::flash_attention_backward_workspace(gs) / 4 + 4);
    const T *q = qkv.data(), *k = q + l.k_offset, *v = q + l.v_offset;
    gpu::flash_attention_forward(dtype_of<T>(), gs, q, l.fused, k, l.fused, v, l.fused, out.data(),
                                 l.plain, lse.data(), nullptr);
    gpu::flash_attention_backward(dtype_of<T>(), gs, dout.data(), l.plain, q, l.fused, k, l.fused,
                                  v, l.fused, out.data(), l.plain, lse.data(), dq.data(), l.plain,
                                  dk.data(), l.plain_kv, dv.data(), l.plain_kv, workspace.data(),
                                  nullptr);
  };
  auto kernels_for = [&]<typename T>(const char* version) {
    std::optional<AttentionVersionVariable> chosen;
    if (version != nullptr) chosen.emplace(version);
    WorkLog log;
    attend.template operator()<T>();
    return attention_kernels(log);
  };
  using Names = std::vector<std::string>;
  auto kernels_of = [](const std::string& v) {
    return Names{"attention_forward_" + v, "attention_delta", "attention_backward_dkdv_" + v,
                 "attention_backward_dq_" + v};
  };
  EXPECT_EQ(kernels_for.operator()<__nv_bfloat16>(nullptr), kernels_of("mma"));  // unset: v3
  const std::pair<const char*, const char*> named[] = {{"v1", "simt"}, {"v2", "tc"}, {"v3", "mma"}};
  for (const auto& [version, kernels] : named) {
    SCOPED_TRACE(version);
    EXPECT_EQ(kernels_for.operator()<__nv_bfloat16>(version), kernels_of(kernels));
    EXPECT_EQ(kernels_for.operator()<float>(version), kernels_of("simt"));
  }
  for (const char* unknown : {"v4", "", "V3"}) {
    AttentionVersionVariable chosen(unknown);
    try {
      attend.operator()<float>();
      FAIL() << "'" << unknown << "' must be refused";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(std::string("='") + unknown + "': expected v1, v2 or v3"),
          std::string::npos)
          << e.what();
    }
  }
}

// Key/value heads that do not divide the query heads are refused, naming both counts.
TEST(EmulatedAttention, KeyValueHeadsThatDoNotDivideTheQueryHeadsAreRefused) {
  std::vector<float> buffer(4096), lse(64);
  const int64_t strides[3] = {1024, 256, 16};
  for (const int64_t kv_heads : {int64_t{0}, int64_t{3}, int64_t{8}}) {
    const gpu::AttentionShape gs{1, 4, 4, 16, kv_heads};
    try {
      gpu::flash_attention_forward(DType::F32, gs, buffer.data(), strides, buffer.data(), strides,
                                   buffer.data(), strides, buffer.data(), strides, lse.data(),
                                   nullptr);
      ADD_FAILURE() << kv_heads << " key/value heads for 4 query heads were taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("key/value heads dividing the 4 query heads"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(EmulatedAttention, TheTensorCoreVersionsTakeBf16Only) {
  EXPECT_FALSE(gpu::attention_version_supports(gpu::AttentionVersion::kTensorCore, DType::F32));
  EXPECT_FALSE(gpu::attention_version_supports(gpu::AttentionVersion::kMma, DType::F32));
  EXPECT_TRUE(gpu::attention_version_supports(gpu::AttentionVersion::kMma, DType::BF16));
  EXPECT_TRUE(gpu::attention_version_supports(gpu::AttentionVersion::kSimt, DType::F32));
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
