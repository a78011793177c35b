// Kernel lab for kernels/cuda/gemm (cuBLASLt), on the GEMMs of GPT-2 small at B*T = 8192 rows.
//
// Versions, side by side:
//   v0  naive shared-memory tiled GEMM (one output per thread, 32x32 tiles, f32 accumulation,
//       bias and accumulate fused): the baseline that shows what cuBLASLt buys.
//   v1  kernels::cuda::gemm without bias, then a separate bias-add kernel (an extra read and
//       write of C).
//   v2  kernels::cuda::gemm with the bias in cuBLASLt's epilogue (what the tensor ops use).
// Every version is first validated against kernels::cpu::gemm<float> on small random
// instances (all transposes, padded leading dimensions, batches with a broadcast operand,
// misaligned pointers, k == 0) and on slices of the GPT shapes, for f32, bf16, f16 and f32 with
// TF32; then the full shapes are timed in bf16, f32 (TF32 off) and f32 (TF32 on) and reported
// as TFLOP/s against the measured cuBLASLt limit.
//
// Shapes (Loom's linear keeps weight as [in, out]: y = x W + b):
//   forward  y  = x W + b      NN  m = 8192, n = out, k = in
//   backward dx = dy W^T       NT  m = 8192, n = in,  k = out
//   backward dW = x^T dy       TN  m = in,   n = out, k = 8192
// for qkv 768->2304, attn proj 768->768, fc 768->3072, fc proj 3072->768, and the tied vocab
// projection logits = x wte^T (wte [50304, 768], NT, no bias) with its two backward GEMMs.
//
// Usage: lab_gemm [--no-naive]   (--no-naive skips timing v0, the slow part)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace {

using loom::DType;
using loom::kernels::cuda::from_float;
using loom::kernels::cuda::to_float;
namespace lab = loom::lab;
namespace kcuda = loom::kernels::cuda;

// --- one GEMM problem on device pointers ---------------------------------------------------

struct Gemm {
  DType dtype;
  bool trans_a, trans_b;
  int64_t m, n, k;
  const void* a;
  int64_t lda, stride_a;
  const void* b;
  int64_t ldb, stride_b;
  void* c;
  int64_t ldc, stride_c, batch;
  bool accumulate;
  const void* bias;
};

// --- v0: naive shared-memory tiled GEMM ------------------------------------------------------

constexpr int kTile = 32;

// One thread per output element; each 32x32 block stages a 32x32 tile of op(A) and of op(B)
// in shared memory per step of k. Transposed operands are read with the transposed index
// (uncoalesced: part of what makes this the baseline).
template <typename T>
__global__ void tiled_gemm_kernel(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                  const T* a, int64_t lda, int64_t stride_a, const T* b,
                                  int64_t ldb, int64_t stride_b, T* c, int64_t ldc,
                                  int64_t stride_c, bool accumulate, const T* bias) {
  __shared__ float a_tile[kTile][kTile + 1];  // +1: no bank conflicts on column reads
  __shared__ float b_tile[kTile][kTile + 1];
  a += blockIdx.z * stride_a;
  b += blockIdx.z * stride_b;
  c += blockIdx.z * stride_c;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = int64_t{blockIdx.y} * kTile + ty, col = int64_t{blockIdx.x} * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kTile) {
    int64_t ka = k0 + tx, kb = k0 + ty;
    a_tile[ty][tx] =
        row < m && ka < k ? to_float(trans_a ? a[ka * lda + row] : a[row * lda + ka]) : 0.0f;
    b_tile[ty][tx] =
        kb < k && col < n ? to_float(trans_b ? b[col * ldb + kb] : b[kb * ldb + col]) : 0.0f;
    __syncthreads();
    for (int i = 0; i < kTile; ++i)
      acc += a_tile[ty][i] * b_tile[i][tx];
    __syncthreads();
  }
  if (row < m && col < n) {
    T* out = c + row * ldc + col;
    if (accumulate) acc += to_float(*out);
    if (bias) acc += to_float(bias[col]);
    *out = from_float<T>(acc);
  }
}

void tiled_gemm(const Gemm& g, cudaStream_t stream) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  loom::kernels::cuda::dispatch_float_storage(g.dtype, "tiled_gemm", [&]<typename T>() {
    dim3 block(kTile, kTile);
    dim3 grid(static_cast<unsigned>((g.n + kTile - 1) / kTile),
              static_cast<unsigned>((g.m + kTile - 1) / kTile), static_cast<unsigned>(g.batch));
    tiled_gemm_kernel<T><<<grid, block, 0, stream>>>(
        g.trans_a, g.trans_b, g.m, g.n, g.k, static_cast<const T*>(g.a), g.lda, g.stride_a,
        static_cast<const T*>(g.b), g.ldb, g.stride_b, static_cast<T*>(g.c), g.ldc, g.stride_c,
        g.accumulate, static_cast<const T*>(g.bias));
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// --- v1: GEMM, then a separate bias add ------------------------------------------------------

template <typename T>
__global__ void add_bias_kernel(T* c, const T* bias, int64_t m, int64_t n, int64_t ldc,
                                int64_t stride_c) {
  c += blockIdx.y * stride_c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < m * n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t row = i / n, col = i % n;
    T* out = c + row * ldc + col;
    *out = from_float<T>(to_float(*out) + to_float(bias[col]));
  }
}

void gemm_then_bias(const Gemm& g, cudaStream_t stream) {
  kcuda::gemm(g.dtype, g.dtype, g.trans_a, g.trans_b, g.m, g.n, g.k, g.a, g.lda, g.stride_a, g.b,
              g.ldb, g.stride_b, g.c, g.ldc, g.stride_c, g.batch, g.accumulate, nullptr, nullptr,
              stream);
  if (g.bias == nullptr || g.m == 0 || g.n == 0 || g.batch == 0) return;
  loom::kernels::cuda::dispatch_float_storage(g.dtype, "add_bias", [&]<typename T>() {
    constexpr int kThreads = 256;
    dim3 grid(loom::kernels::cuda::grid_for(g.m * g.n, kThreads, 65535),
              static_cast<unsigned>(g.batch));
    add_bias_kernel<T><<<grid, kThreads, 0, stream>>>(
        static_cast<T*>(g.c), static_cast<const T*>(g.bias), g.m, g.n, g.ldc, g.stride_c);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// --- v2: cuBLASLt with the bias epilogue ------------------------------------------------------

void gemm_fused(const Gemm& g, cudaStream_t stream) {
  kcuda::gemm(g.dtype, g.dtype, g.trans_a, g.trans_b, g.m, g.n, g.k, g.a, g.lda, g.stride_a, g.b,
              g.ldb, g.stride_b, g.c, g.ldc, g.stride_c, g.batch, g.accumulate, g.bias, nullptr,
              stream);
}

struct Version {
  const char* name;
  void (*run)(const Gemm&, cudaStream_t);
};
const Version kNaive{"v0 naive smem tiled", tiled_gemm};
const Version kSplitBias{"v1 cublasLt + bias kernel", gemm_then_bias};
const Version kFused{"v2 cublasLt bias epilogue", gemm_fused};

// --- numeric configurations ----------------------------------------------------------------

struct Config {
  const char* name;
  DType dtype;
  bool tf32;
  lab::Peak peak;
};
const Config kF32{"f32", DType::F32, false, lab::Peak::F32};
const Config kTf32{"f32+tf32", DType::F32, true, lab::Peak::TF32};
const Config kBf16{"bf16", DType::BF16, false, lab::Peak::BF16};
const Config kF16{"f16", DType::F16, false, lab::Peak::BF16};


lab::Tolerance tolerance_for(const Config& config, int64_t k) {
  // TF32 rounds every input to a 10-bit mantissa (~2^-11 relative); over k products of
  // random signs the error grows like sqrt(k). f32 accumulation errors grow the same way.
  if (config.tf32) return {3e-3 * std::sqrt(static_cast<double>(std::max<int64_t>(k, 1))), 1e-2};
  return lab::default_tolerance(config.dtype);
}

// --- validation ------------------------------------------------------------------------------

struct Case {
  const char* name;
  bool trans_a, trans_b;
  int64_t m, n, k;
  int64_t batch = 1;
  bool bias = false;
  bool accumulate = false;
  int64_t pad = 0;           // extra leading-dimension elements on A, B and C
  bool broadcast_b = false;  // stride_b = 0: one B for the whole batch
  int64_t offset = 0;        // elements every pointer is shifted by (misaligns them)
  int64_t gap_c = 0;         // extra elements between the batch's C matrices
};

// Runs one case through `version` and compares the whole C buffer (padding included, which
// must come back untouched) with the CPU reference.
bool check_case(const Case& cs, const Config& config, const Version& version) {
  const DType dtype = config.dtype;
  const size_t es = loom::dtype_size(dtype);
  const int64_t a_rows = cs.trans_a ? cs.k : cs.m, a_cols = cs.trans_a ? cs.m : cs.k;
  const int64_t b_rows = cs.trans_b ? cs.n : cs.k, b_cols = cs.trans_b ? cs.k : cs.n;
  const int64_t lda = std::max<int64_t>(a_cols + cs.pad, 1);
  const int64_t ldb = std::max<int64_t>(b_cols + cs.pad, 1);
  const int64_t ldc = std::max<int64_t>(cs.n + cs.pad, 1);
  const int64_t stride_a = a_rows * lda, stride_b = cs.broadcast_b ? 0 : b_rows * ldb;
  const int64_t stride_c = cs.m * ldc + cs.gap_c;
  const int64_t b_count = cs.broadcast_b ? 1 : cs.batch;
  const size_t a_len = cs.offset + cs.batch * stride_a, b_len = cs.offset + b_count * b_rows * ldb;
  const size_t c_len = cs.offset + cs.batch * stride_c, bias_len = cs.offset + cs.n;

  uint64_t seed = 1000 + cs.m * 7 + cs.n * 13 + cs.k * 17;
  std::vector<float> a = lab::rounded(lab::random_floats(a_len, seed + 1), dtype);
  std::vector<float> b = lab::rounded(lab::random_floats(b_len, seed + 2), dtype);
  std::vector<float> c = lab::rounded(lab::random_floats(c_len, seed + 3), dtype);
  std::vector<float> bias = lab::rounded(lab::random_floats(bias_len, seed + 4), dtype);

  std::vector<float> want = c;
  for (int64_t i = 0; i < cs.batch; ++i) {
    float* ci = want.data() + cs.offset + i * stride_c;
    loom::kernels::cpu::gemm<float>(
        cs.trans_a, cs.trans_b, cs.m, cs.n, cs.k, a.data() + cs.offset + i * stride_a, lda,
        b.data() + cs.offset + i * stride_b, ldb, ci, ldc, cs.accumulate);
    if (!cs.bias) continue;
    for (int64_t r = 0; r < cs.m; ++r)
      for (int64_t j = 0; j < cs.n; ++j)
        ci[r * ldc + j] += bias[cs.offset + j];
  }

  lab::DeviceBuffer da = lab::upload(a, dtype), db = lab::upload(b, dtype);
  lab::DeviceBuffer dc = lab::upload(c, dtype), dbias = lab::upload(bias, dtype);
  auto at = [&](lab::DeviceBuffer& buf) {
    return buf.get() ? static_cast<unsigned char*>(buf.get()) + cs.offset * es : nullptr;
  };
  Gemm g{dtype,  cs.trans_a, cs.trans_b, cs.m,     cs.n,          cs.k,
         at(da), lda,        stride_a,   at(db),   ldb,           stride_b,
         at(dc), ldc,        stride_c,   cs.batch, cs.accumulate, cs.bias ? at(dbias) : nullptr};
  kcuda::set_allow_tf32(config.tf32);
  version.run(g, nullptr);  // legacy default stream; download() synchronises the device
  std::string label = std::string(config.name) + " " + cs.name + " " + version.name;
  lab::Comparison result =
      lab::compare(lab::download(dc, dtype, c_len), want, tolerance_for(config, cs.k), label);
  return result.ok;
}

bool validate_all() {
  const std::vector<Case> cases = {
      {"NN 67x45x33", false, false, 67, 45, 33},
      {"NT 67x45x33", false, true, 67, 45, 33},
      {"TN 67x45x33", true, false, 67, 45, 33},
      {"TT 67x45x33", true, true, 67, 45, 33},
      {"NN 64x64x64 bias", false, false, 64, 64, 64, 1, true},
      {"TN 67x45x33 bias+accumulate", true, false, 67, 45, 33, 1, true, true},
      {"NT batch 3, padded ld, broadcast B, bias+acc", false, true, 37, 29, 41, 3, true, true, 5,
       true},
      {"TT batch 2, misaligned pointers, bias", true, true, 33, 31, 19, 2, true, false, 3, false,
       1},
      {"NN k=0 bias+accumulate", false, false, 5, 7, 0, 2, true, true},
      {"NN k=0 bias", false, false, 5, 7, 0, 1, true, false},
      {"NN k=0 zero, batch 2 with gaps", false, false, 5, 7, 0, 2, false, false, 2, false, 0, 3},
      {"NN k=0 accumulate (no-op)", false, false, 5, 7, 0, 1, false, true},
      {"NN m=0 (no-op)", false, false, 0, 7, 9},
      {"qkv fwd slice NN 256x768->2304 bias", false, false, 256, 2304, 768, 1, true},
      {"fc proj dx slice NT 256x768<-3072", false, true, 256, 768, 3072},
      {"fc dW slice TN 768x3072, k=1024", true, false, 768, 3072, 1024},
  };
  bool ok = true;
  for (const Config& config : {kF32, kBf16, kF16, kTf32}) {
    std::printf("validation, %s:\n", config.name);
    for (const Case& cs : cases) {
      ok = check_case(cs, config, kFused) && ok;
      if (cs.bias) ok = check_case(cs, config, kSplitBias) && ok;
      if (!config.tf32) ok = check_case(cs, config, kNaive) && ok;
    }
  }
  kcuda::set_allow_tf32(false);
  return ok;
}

// --- timing the GPT-2 shapes -----------------------------------------------------------------

struct Shape {
  std::string name;
  bool trans_a, trans_b;
  int64_t m, n, k;
  bool bias;
};

std::vector<Shape> gpt2_shapes() {
  constexpr int64_t kRows = 8192;  // B*T
  struct Layer {
    const char* name;
    int64_t in, out;
  };
  std::vector<Shape> shapes;
  for (Layer l : {Layer{"qkv", 768, 2304}, Layer{"attn proj", 768, 768}, Layer{"fc", 768, 3072},
                  Layer{"fc proj", 3072, 768}}) {
    shapes.push_back({std::string(l.name) + " fwd", false, false, kRows, l.out, l.in, true});
    shapes.push_back({std::string(l.name) + " dx", false, true, kRows, l.in, l.out, false});
    shapes.push_back({std::string(l.name) + " dW", true, false, l.in, l.out, kRows, false});
  }
  constexpr int64_t kVocab = 50304, kEmbd = 768;
  shapes.push_back({"lm head fwd", false, true, kRows, kVocab, kEmbd, false});
  shapes.push_back({"lm head dx", false, false, kRows, kEmbd, kVocab, false});
  shapes.push_back({"lm head dW", true, false, kVocab, kEmbd, kRows, false});
  return shapes;
}

void time_shape(const Shape& s, const Config& config, bool naive, cudaStream_t stream) {
  const DType dtype = config.dtype;
  const size_t es = loom::dtype_size(dtype);
  const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
  lab::DeviceBuffer a(static_cast<size_t>(s.m * s.k) * es), b(static_cast<size_t>(s.k * s.n) * es);
  lab::DeviceBuffer c(static_cast<size_t>(s.m * s.n) * es), bias(static_cast<size_t>(s.n) * es);
  lab::fill_uniform(a.get(), dtype, static_cast<size_t>(s.m * s.k), 11, stream);
  lab::fill_uniform(b.get(), dtype, static_cast<size_t>(s.k * s.n), 12, stream);
  lab::fill_uniform(bias.get(), dtype, static_cast<size_t>(s.n), 13, stream);
  Gemm g{dtype,   s.trans_a, s.trans_b, s.m,     s.n,   s.k,
         a.get(), lda,       0,         b.get(), ldb,   0,
         c.get(), s.n,       0,         1,       false, s.bias ? bias.get() : nullptr};
  kcuda::set_allow_tf32(config.tf32);

  char kernel[96];
  std::snprintf(kernel, sizeof kernel, "%s %s%s %lldx%lldx%lld %s", s.name.c_str(),
                s.trans_a ? "T" : "N", s.trans_b ? "T" : "N", static_cast<long long>(s.m),
                static_cast<long long>(s.k), static_cast<long long>(s.n), config.name);
  const double flops = 2.0 * s.m * s.n * s.k;
  const double bytes =
      static_cast<double>(es) * (s.m * s.k + s.k * s.n + s.m * s.n + (s.bias ? s.n : 0));
  auto run = [&](const Version& v, int warmup, int repeats) {
    double ms = lab::time_ms([&](cudaStream_t st) { v.run(g, st); }, stream, warmup, repeats);
    lab::report(kernel, v.name, ms, bytes, flops, config.peak);
  };
  if (naive && !config.tf32) run(kNaive, 1, 2);
  if (s.bias) run(kSplitBias, 3, 20);
  run(kFused, 3, 20);
}

}  // namespace

int main(int argc, char** argv) {
  std::string why;
  if (!lab::gpu_available(&why)) {
    std::printf("no CUDA device: %s\n", why.c_str());
    return 0;
  }
  bool naive = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-naive") == 0) {
      naive = false;
    } else {
      std::fprintf(stderr, "usage: %s [--no-naive]\n", argv[0]);
      return 2;
    }
  }
  try {
    lab::measured_limits();
    if (!validate_all()) {
      std::printf("validation FAILED: not timing\n");
      return 1;
    }
    lab::Stream stream;
    std::printf("GPT-2 small GEMMs (m x k x n, B*T = 8192):\n");
    for (const Config& config : {kBf16, kF32, kTf32}) {
      for (const Shape& s : gpt2_shapes())
        time_shape(s, config, naive, stream.get());
    }
    kcuda::set_allow_tf32(false);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lab_gemm: %s\n", e.what());
    return 1;
  }
  return 0;
}
