// Kernel lab: fused causal attention, forward and backward (see bench/cuda/lab.h for the
// framework, kernels/cuda/attention.cu Note [Attention versions] for the kernels).
//
// Versions side by side, each validated against kernels/cpu/attention (in f64, on the same
// rounded inputs) before it is timed:
//   v1 SIMT       f32 and bf16: 32 x 32 tiles, CUDA-core FMAs
//   v2 WMMA       bf16 only: 64 x 64 tiles, bf16 tensor-core MMAs (P and dS rounded to bf16)
//   v3 mma.sync   bf16 only: 64 x 64 tiles, mma.sync m16n8k16 with scores and probabilities
//                 in registers, tiles double-buffered by cp.async (P and dS rounded to bf16)
//   loom          the public launchers (flash_attention_forward/backward): validated only,
//                 they run one of the versions above (attention.h says which)
// Operands are laid out as GPT-2 produces them: q, k, v are strided views into one fused
// [B, T, 3, H, D] projection, out and dout are [B, T, H, D], and the gradients land in a fused
// [B, T, 3, H, D] buffer. Each shape is checked on a few (b, h) heads (all of them for small
// shapes), including the timed GPT-2 small shape itself (B=8, H=12, T=1024, D=64).
// FLOPs: 4*B*H*T*T*D / 2 for the causal forward (QK^T and PV, upper triangle skipped),
// 2.5x that for backward (five T x T x D products instead of two).
//
// Build: nvcc -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I. -I/usr/include/eigen3
//   bench/cuda/lab_attention.cu bench/cuda/lab.cu kernels/cuda/attention.cu kernels/cuda/gemm.cpp
//   kernels/cpu/attention.cpp kernels/cpu/gemm.cpp kernels/cpu/softmax.cpp core/dtype.cpp
//   core/error.cpp
//   kernels/cuda/cublaslt_library.cpp -ldl
// Run: ./lab_attention   (prints "no CUDA device: ..." and exits 0 without a GPU)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/check.h"

namespace {

using loom::DType;
using namespace loom::lab;
namespace kc = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;


struct Shape {
  int64_t batch, heads, time, head_dim;
  bool timed;
};

// Element offsets of the lab's layouts ([B, T, 3, H, D] fused, [B, T, H, D] plain).
struct Layouts {
  int64_t fused[3], plain[3];
  int64_t hd;  // H * D: offset of k (and 2 * hd of v) in the fused buffer
  Layouts(const Shape& s) : hd(s.heads * s.head_dim) {
    fused[0] = s.time * 3 * hd, fused[1] = s.head_dim, fused[2] = 3 * hd;
    plain[0] = s.time * hd, plain[1] = s.head_dim, plain[2] = hd;
  }
};

// One head (b, h) of a strided operand as contiguous [T, D] doubles.
std::vector<double> head_of(const std::vector<float>& buf, const int64_t* st, int64_t offset,
                            int64_t b, int64_t h, int64_t time, int64_t dim) {
  std::vector<double> out(static_cast<size_t>(time * dim));
  for (int64_t t = 0; t < time; ++t)
    for (int64_t d = 0; d < dim; ++d)
      out[t * dim + d] = buf[offset + b * st[0] + h * st[1] + t * st[2] + d];
  return out;
}
std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

// The CPU answers for one head: out, logsumexp, dq, dk, dv.
struct HeadReference {
  std::vector<float> out, lse, dq, dk, dv;
};

HeadReference reference_head(const std::vector<double>& q, const std::vector<double>& k,
                             const std::vector<double>& v, const std::vector<double>& dout,
                             int64_t time, int64_t dim) {
  const cpu::AttentionShape s{1, 1, time, dim, 1};
  const int64_t st[3] = {0, 0, dim};
  const size_t n = static_cast<size_t>(time * dim);
  std::vector<double> out(n), dq(n), dk(n), dv(n), lse(static_cast<size_t>(time));
  cpu::causal_attention_forward<double>(s, q.data(), st, k.data(), st, v.data(), st, out.data(), st,
                                        lse.data());
  cpu::causal_attention_backward<double>(s, dout.data(), st, q.data(), st, k.data(), st, v.data(),
                                         st, out.data(), st, lse.data(), dq.data(), st, dk.data(),
                                         st, dv.data(), st);
  return {to_float(out), to_float(lse), to_float(dq), to_float(dk), to_float(dv)};
}

struct Version {
  std::string name;
  bool is_public;  // the public launchers: validated, not timed
  kc::AttentionVersion version;
};

// Runs every version on one shape and dtype; returns false when any validation failed.
bool run_shape(const Shape& shape, DType dtype) {
  const int64_t B = shape.batch, H = shape.heads, T = shape.time, D = shape.head_dim;
  std::printf("attention B=%lld H=%lld T=%lld D=%lld %s\n", static_cast<long long>(B),
              static_cast<long long>(H), static_cast<long long>(T), static_cast<long long>(D),
              loom::dtype_name(dtype));
  const Layouts lay(shape);
  const size_t n_fused = static_cast<size_t>(B * T * 3 * lay.hd);
  const size_t n_plain = static_cast<size_t>(B * T * lay.hd);
  const size_t rows = static_cast<size_t>(B * H * T);
  const kc::AttentionShape s{B, H, T, D, H};  // multi-head (the kernels take grouped heads too)

  // Inputs as the device sees them; q and k in [-2, 2) so that the softmax is not flat.
  const std::vector<float> qkv = rounded(random_floats(n_fused, 11, -2.0f, 2.0f), dtype);
  const std::vector<float> dout = rounded(random_floats(n_plain, 12), dtype);

  // Heads to check: all of them for small shapes, else the first and the last.
  std::vector<std::pair<int64_t, int64_t>> heads;
  if (B * H <= 8) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        heads.push_back({b, h});
  } else {
    heads = {{0, 0}, {B - 1, H - 1}};
  }
  std::vector<HeadReference> refs;
  for (auto [b, h] : heads) {
    refs.push_back(reference_head(head_of(qkv, lay.fused, 0, b, h, T, D),
                                  head_of(qkv, lay.fused, lay.hd, b, h, T, D),
                                  head_of(qkv, lay.fused, 2 * lay.hd, b, h, T, D),
                                  head_of(dout, lay.plain, 0, b, h, T, D), T, D));
  }

  DeviceBuffer d_qkv = upload(qkv, dtype), d_dout = upload(dout, dtype);
  DeviceBuffer d_out(n_plain * loom::dtype_size(dtype)), d_grads(n_fused * loom::dtype_size(dtype));
  DeviceBuffer d_lse(rows * sizeof(float));
  DeviceBuffer d_ws(kc::flash_attention_backward_workspace(s));
  Stream stream;
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // uploads are done before the stream reads them

  const size_t es = loom::dtype_size(dtype);
  const char* qkv_base = static_cast<const char*>(d_qkv.get());
  const void* q = qkv_base;
  const void* k = qkv_base + lay.hd * es;
  const void* v = qkv_base + 2 * lay.hd * es;
  char* grad_base = static_cast<char*>(d_grads.get());
  void* dq = grad_base;
  void* dk = grad_base + lay.hd * es;
  void* dv = grad_base + 2 * lay.hd * es;
  auto* lse = static_cast<float*>(d_lse.get());

  std::vector<Version> versions = {{"v1 SIMT", false, kc::AttentionVersion::kSimt}};
  if (kc::attention_version_supports(kc::AttentionVersion::kTensorCore, dtype))
    versions.push_back({"v2 WMMA bf16", false, kc::AttentionVersion::kTensorCore});
  if (kc::attention_version_supports(kc::AttentionVersion::kMma, dtype))
    versions.push_back({"v3 mma.sync bf16", false, kc::AttentionVersion::kMma});
  versions.push_back({"loom (public launchers)", true, kc::AttentionVersion::kSimt});

  const double causal_flops = 4.0 * B * H * T * T * D / 2.0;
  const double n_elems = static_cast<double>(B * H * T * D);
  const double forward_bytes = 4.0 * n_elems * es + 4.0 * rows;
  const double backward_bytes = 8.0 * n_elems * es + 8.0 * rows;
  const Peak peak = dtype == DType::F32 ? Peak::F32 : Peak::BF16;
  const std::string label = "B" + std::to_string(B) + " H" + std::to_string(H) + " T" +
                            std::to_string(T) + " D" + std::to_string(D) + " " + loom::dtype_name(dtype);
  bool ok = true;
  for (const Version& ver : versions) {
    auto forward = [&](cudaStream_t st) {
      if (ver.is_public) {
        kc::flash_attention_forward(dtype, s, q, lay.fused, k, lay.fused, v, lay.fused, d_out.get(),
                                    lay.plain, lse, st);
      } else {
        kc::flash_attention_forward_version(ver.version, dtype, s, q, lay.fused, k, lay.fused, v,
                                            lay.fused, d_out.get(), lay.plain, lse, st);
      }
    };
    auto backward = [&](cudaStream_t st) {
      if (ver.is_public) {
        kc::flash_attention_backward(dtype, s, d_dout.get(), lay.plain, q, lay.fused, k, lay.fused,
                                     v, lay.fused, d_out.get(), lay.plain, lse, dq, lay.fused, dk,
                                     lay.fused, dv, lay.fused, d_ws.get(), st);
      } else {
        kc::flash_attention_backward_version(ver.version, dtype, s, d_dout.get(), lay.plain, q,
                                             lay.fused, k, lay.fused, v, lay.fused, d_out.get(),
                                             lay.plain, lse, dq, lay.fused, dk, lay.fused, dv,
                                             lay.fused, d_ws.get(), st);
      }
    };
    std::printf(" %s\n", ver.name.c_str());
    // NaN everywhere first (0xff bytes are NaN in f32 and bf16): every element must be written.
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_out.get(), 0xff, d_out.bytes(), stream.get()));
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_lse.get(), 0xff, d_lse.bytes(), stream.get()));
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_grads.get(), 0xff, d_grads.bytes(), stream.get()));
    forward(stream.get());
    backward(stream.get());
    const std::vector<float> out = download(d_out, dtype, n_plain);
    const std::vector<float> lse_host = download(d_lse, DType::F32, rows);
    const std::vector<float> grads = download(d_grads, dtype, n_fused);

    // v2 and v3 (the public bf16 path) normalise by the sum of the bf16-rounded weights they
    // multiply V with, so their logsumexp carries that rounding (~1e-3).
    const bool rounded_weights =
        dtype == DType::BF16 && (ver.is_public || ver.version != kc::AttentionVersion::kSimt);
    const Tolerance lse_tol =
        rounded_weights ? Tolerance{3e-3, 3e-3} : default_tolerance(DType::F32);
    bool good = true;
    for (size_t i = 0; i < heads.size(); ++i) {
      const auto [b, h] = heads[i];
      const std::string at = " (b=" + std::to_string(b) + ", h=" + std::to_string(h) + ")";
      const HeadReference& ref = refs[i];
      auto head = [&](const std::vector<float>& buf, const int64_t* st, int64_t offset) {
        return to_float(head_of(buf, st, offset, b, h, T, D));
      };
      good &= compare(head(out, lay.plain, 0), ref.out, dtype, "out" + at).ok;
      const auto lse_begin = lse_host.begin() + (b * H + h) * T;
      good &=
          compare(std::vector<float>(lse_begin, lse_begin + T), ref.lse, lse_tol, "logsumexp" + at)
              .ok;
      good &= compare(head(grads, lay.fused, 0), ref.dq, dtype, "dq" + at).ok;
      good &= compare(head(grads, lay.fused, lay.hd), ref.dk, dtype, "dk" + at).ok;
      good &= compare(head(grads, lay.fused, 2 * lay.hd), ref.dv, dtype, "dv" + at).ok;
    }
    // The whole buffers must be finite (no head left unwritten), and backward deterministic.
    const bool finite =
        std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }) &&
        std::all_of(grads.begin(), grads.end(), [](float x) { return std::isfinite(x); });
    std::printf("  check every output element written and finite: %s\n", finite ? "ok" : "FAILED");
    backward(stream.get());
    const bool same = download(d_grads, dtype, n_fused) == grads;
    std::printf("  check gradients bitwise equal on a second run: %s\n", same ? "ok" : "FAILED");
    good &= finite && same;
    ok &= good;

    if (good && shape.timed && !ver.is_public) {
      report("attention_forward " + label, ver.name, time_ms(forward, stream.get()), forward_bytes,
             causal_flops, peak);
      report("attention_backward " + label, ver.name, time_ms(backward, stream.get()),
             backward_bytes, 2.5 * causal_flops, peak);
    }
  }
  return ok;
}

}  // namespace

int main() {
  std::string why;
  if (!gpu_available(&why)) {
    std::printf("no CUDA device: %s\n", why.c_str());
    return 0;
  }
  measured_limits();  // measures (and prints) the device's limits before the first check
  const Shape shapes[] = {
      {1, 2, 5, 8, false},     {2, 3, 16, 16, false},  // tests' sizes: a partial tile
      {2, 2, 77, 40, false},                           // padded head dim (bucket 64), T % 64 != 0
      {1, 2, 130, 100, false},                         // bucket 128
      {8, 12, 1024, 64, true},                         // GPT-2 small, timed
  };
  bool ok = true;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const Shape& shape : shapes)
      ok &= run_shape(shape, dtype);
  }
  std::printf("%s\n", ok ? "all versions validated" : "VALIDATION FAILED");
  return ok ? 0 : 1;
}
