// Kernel lab: row softmax (causal attention scores) and cross-entropy over the vocabulary (see
// bench/cuda/lab.h for the framework).
//
// Versions side by side, each validated against kernels/cpu/softmax on the same (rounded)
// random inputs before it is timed:
//   softmax forward   v1 block per row, three passes (max, sum, write), scalar (lab-local)
//                     v2 loom: warp per row, online max/sum in one pass, 16-byte loads
//   softmax backward  loom (out of place, and in place: dx aliasing dy)
//   cross-entropy fwd v1 block per row, two passes (max, then sum of exps), scalar (lab-local)
//                     v2 loom: block per row, online max/sum in one pass, 16-byte loads
//   cross-entropy bwd loom out of place, and in place (dlogits aliasing logits)
// Shapes: attention scores of GPT-2 small for one sequence (12 heads x 1024 x 1024, causal),
// logits 8192 x 50304 (GPT-2's padded vocabulary), plus odd shapes for the scalar paths
// (validation only).
//
// Build: nvcc -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I. bench/cuda/lab_softmax.cu
//   bench/cuda/lab.cu kernels/cuda/softmax.cu kernels/cuda/gemm.cpp kernels/cpu/softmax.cpp
//   core/dtype.cpp (+ core/error.cpp)
//   kernels/cuda/cublaslt_library.cpp -ldl
// Run: ./lab_softmax   (prints "no CUDA device: ..." and exits 0 without a GPU)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax.h"

namespace {

using loom::DType;
using namespace loom::lab;
namespace kc = loom::kernels::cuda;



std::string shape_label(const char* kernel, int64_t rows, int64_t width, DType dtype) {
  return std::string(kernel) + " " + std::to_string(rows) + "x" + std::to_string(width) + " " +
         loom::dtype_name(dtype);
}

// ---- v1 softmax forward: block per row, three passes -----------------------------------------

template <typename T>
__global__ void softmax_three_pass(const T* x, T* y, int width, int64_t causal_t) {
  __shared__ float scratch[kc::kWarpSize];
  const int64_t row = blockIdx.x;
  const int valid = causal_t > 0 ? static_cast<int>(row % causal_t) + 1 : width;
  const T* xr = x + row * width;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < valid; i += blockDim.x)
    m = fmaxf(m, kc::to_float(xr[i]));
  m = kc::block_max(m, scratch);
  float s = 0.0f;
  for (int i = threadIdx.x; i < valid; i += blockDim.x)
    s += expf(kc::to_float(xr[i]) - m);
  const float inv = 1.0f / kc::block_sum(s, scratch);
  T* yr = y + row * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x)
    yr[i] = kc::from_float<T>(i < valid ? expf(kc::to_float(xr[i]) - m) * inv : 0.0f);
}

void softmax_v1(DType dtype, const void* x, void* y, int64_t rows, int64_t width, int64_t causal_t,
                cudaStream_t stream) {
  kc::dispatch_float_storage(dtype, "softmax_v1", [&]<typename T>() {
    softmax_three_pass<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), static_cast<int>(width), causal_t);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// ---- v1 cross-entropy forward: block per row, two passes --------------------------------------

template <typename T>
__global__ void cross_entropy_two_pass(const T* logits, const int64_t* targets, float* logsumexp,
                                       float* row_losses, int vocab) {
  __shared__ float scratch[kc::kWarpSize];
  const T* xr = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    m = fmaxf(m, kc::to_float(xr[i]));
  m = kc::block_max(m, scratch);
  float s = 0.0f;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    s += expf(kc::to_float(xr[i]) - m);
  s = kc::block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const float lse = m + logf(s);
    logsumexp[blockIdx.x] = lse;
    row_losses[blockIdx.x] = lse - kc::to_float(xr[targets[blockIdx.x]]);
  }
}

// One warp: lane-strided f64 sums, then a shuffle tree.
__global__ void mean_one_warp(const float* row_losses, float* mean_loss, int64_t rows) {
  double sum = 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kc::kWarpSize)
    sum += row_losses[r];
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (threadIdx.x == 0) mean_loss[0] = static_cast<float>(sum / rows);
}

void cross_entropy_v1(DType dtype, const void* logits, const int64_t* targets, float* lse,
                      float* losses, float* mean, int64_t rows, int64_t vocab,
                      cudaStream_t stream) {
  kc::dispatch_float_storage(dtype, "cross_entropy_v1", [&]<typename T>() {
    cross_entropy_two_pass<T><<<static_cast<unsigned>(rows), 512, 0, stream>>>(
        static_cast<const T*>(logits), targets, lse, losses, static_cast<int>(vocab));
    LOOM_CUDA_CHECK_LAUNCH();
    mean_one_warp<<<1, kc::kWarpSize, 0, stream>>>(losses, mean, rows);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// ---- softmax ----------------------------------------------------------------------------------

bool run_softmax(int64_t rows, int64_t width, bool causal, bool timed, DType dtype) {
  const int64_t causal_t = causal ? width : 0;
  const size_t n = static_cast<size_t>(rows * width);
  std::printf("softmax %lld x %lld%s %s\n", static_cast<long long>(rows),
              static_cast<long long>(width), causal ? " causal" : "", loom::dtype_name(dtype));
  const std::vector<float> x = rounded(random_floats(n, 11, -4.0f, 4.0f), dtype);
  const std::vector<float> dy = rounded(random_floats(n, 12), dtype);
  std::vector<float> y_ref(n), dx_ref(n);
  loom::kernels::cpu::softmax_forward<float>(x.data(), y_ref.data(), rows, width, causal_t);
  // Backward takes y as the device stores it (rounded to dtype).
  const std::vector<float> y_in = rounded(y_ref, dtype);
  loom::kernels::cpu::softmax_backward<float>(y_in.data(), dy.data(), dx_ref.data(), rows, width);

  DeviceBuffer d_x = upload(x, dtype), d_dy = upload(dy, dtype), d_y_in = upload(y_in, dtype);
  DeviceBuffer d_y(n * loom::dtype_size(dtype)), d_dx(n * loom::dtype_size(dtype));
  Stream stream;
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // uploads are done before the stream reads them
  const double es = static_cast<double>(loom::dtype_size(dtype));
  // Minimum traffic: read the unmasked scores once, write every output.
  const double read = causal ? static_cast<double>(rows / width) * width * (width + 1) / 2.0 +
                                   static_cast<double>(rows % width) * (rows % width + 1) / 2.0
                             : static_cast<double>(n);
  bool ok = true;

  const std::vector<KernelVersion> forward = {
      {"v1 block/row, 3 passes, scalar",
       [&](cudaStream_t s) { softmax_v1(dtype, d_x.get(), d_y.get(), rows, width, causal_t, s); }},
      {"v2 loom (online, warp/row)",
       [&](cudaStream_t s) {
         kc::softmax_forward(dtype, d_x.get(), d_y.get(), rows, width, causal_t, s);
       }},
  };
  for (const KernelVersion& v : forward) {
    std::printf(" forward %s\n", v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_y.get(), 0x7f, d_y.bytes(), stream.get()));
    v.launch(stream.get());
    const bool good = compare(download(d_y, dtype, n), y_ref, dtype, "y").ok;
    ok &= good;
    if (good && timed) {
      report(shape_label("softmax_forward", rows, width, dtype), v.name,
             time_ms(v.launch, stream.get()), es * (read + n), 0.0);
    }
  }

  DeviceBuffer d_inplace(n * loom::dtype_size(dtype));
  const std::vector<KernelVersion> backward = {
      {"loom",
       [&](cudaStream_t s) {
         kc::softmax_backward(dtype, d_y_in.get(), d_dy.get(), d_dx.get(), rows, width, s);
       }},
      {"loom in place (dx = dy)",
       [&](cudaStream_t s) {
         kc::softmax_backward(dtype, d_y_in.get(), d_inplace.get(), d_inplace.get(), rows, width,
                              s);
       }},
  };
  for (size_t k = 0; k < backward.size(); ++k) {
    const KernelVersion& v = backward[k];
    std::printf(" backward %s\n", v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_dx.get(), 0x7f, d_dx.bytes(), stream.get()));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(d_inplace.get(), d_dy.get(), d_dy.bytes(),
                                    cudaMemcpyDeviceToDevice, stream.get()));
    v.launch(stream.get());
    const bool good =
        compare(download(k == 0 ? d_dx : d_inplace, dtype, n), dx_ref, dtype, "dx").ok;
    ok &= good;
    if (good && timed) {
      report(shape_label("softmax_backward", rows, width, dtype), v.name,
             time_ms(v.launch, stream.get()), es * 3.0 * n, 0.0);
    }
  }
  return ok;
}

// ---- cross-entropy ----------------------------------------------------------------------------

bool run_cross_entropy(int64_t rows, int64_t vocab, bool timed, DType dtype) {
  const size_t n = static_cast<size_t>(rows * vocab);
  std::printf("cross_entropy %lld x %lld %s\n", static_cast<long long>(rows),
              static_cast<long long>(vocab), loom::dtype_name(dtype));
  const std::vector<float> logits = rounded(random_floats(n, 21, -4.0f, 4.0f), dtype);
  std::vector<int64_t> targets(rows);
  {
    const std::vector<float> u = random_floats(rows, 22, 0.0f, 1.0f);
    for (int64_t r = 0; r < rows; ++r)
      targets[r] = std::min<int64_t>(vocab - 1, static_cast<int64_t>(u[r] * vocab));
  }
  std::vector<float> lse_ref(rows), loss_ref(rows);
  const double mean_ref = loom::kernels::cpu::cross_entropy_forward<float>(
      logits.data(), targets.data(), lse_ref.data(), rows, vocab);
  for (int64_t r = 0; r < rows; ++r)
    loss_ref[r] = lse_ref[r] - logits[r * vocab + targets[r]];
  // dloss = rows, so that dlogits = softmax - onehot (exact in bf16 for these row counts).
  const float dloss = static_cast<float>(rows);
  std::vector<float> dlogits_ref(n);
  loom::kernels::cpu::cross_entropy_backward<float>(logits.data(), targets.data(), lse_ref.data(),
                                                    dloss / static_cast<float>(rows),
                                                    dlogits_ref.data(), rows, vocab);

  DeviceBuffer d_logits = upload(logits, dtype);
  DeviceBuffer d_targets(rows * sizeof(int64_t));
  LOOM_CUDA_CHECK(
      cudaMemcpy(d_targets.get(), targets.data(), d_targets.bytes(), cudaMemcpyHostToDevice));
  DeviceBuffer d_dloss = upload({dloss}, DType::F32);  // the loss is f32 for every storage
  DeviceBuffer d_lse(rows * sizeof(float)), d_losses(rows * sizeof(float));
  DeviceBuffer d_mean(sizeof(float)), d_dlogits(n * loom::dtype_size(dtype));
  auto* targets_p = static_cast<const int64_t*>(d_targets.get());
  auto* lse = static_cast<float*>(d_lse.get());
  auto* losses = static_cast<float*>(d_losses.get());
  auto* mean = static_cast<float*>(d_mean.get());
  Stream stream;
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // uploads are done before the stream reads them
  const double es = static_cast<double>(loom::dtype_size(dtype));
  const Tolerance f32_tol = default_tolerance(DType::F32);  // lse and row losses are f32
  // dlogits are softmax values down to ~1e-8: relative tolerance only.
  const Tolerance grad_tol{1e-10, dtype == DType::F32 ? 1e-4 : 2e-2};
  bool ok = true;

  const std::vector<KernelVersion> forward = {
      {"v1 block/row, 2 passes, scalar",
       [&](cudaStream_t s) {
         cross_entropy_v1(dtype, d_logits.get(), targets_p, lse, losses, mean, rows, vocab,
                          s);
       }},
      {"v2 loom (online, 1 pass)",
       [&](cudaStream_t s) {
         kc::cross_entropy_forward(dtype, d_logits.get(), targets_p, lse, losses, mean,
                                   rows, vocab, s);
       }},
  };
  for (const KernelVersion& v : forward) {
    std::printf(" forward %s\n", v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_lse.get(), 0, d_lse.bytes(), stream.get()));
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_losses.get(), 0, d_losses.bytes(), stream.get()));
    v.launch(stream.get());
    bool good = compare(download(d_lse, DType::F32, rows), lse_ref, f32_tol, "logsumexp").ok;
    good &= compare(download(d_losses, DType::F32, rows), loss_ref, f32_tol, "row losses").ok;
    good &= compare(download(d_mean, DType::F32, 1), {static_cast<float>(mean_ref)}, DType::F32,
                    "mean").ok;
    ok &= good;
    if (good && timed) {
      report(shape_label("cross_entropy_forward", rows, vocab, dtype), v.name,
             time_ms(v.launch, stream.get()), es * n + 16.0 * rows, 0.0);
    }
  }

  // Backward reads the loom forward's logsumexp (validated above, or the run has failed).
  kc::cross_entropy_forward(dtype, d_logits.get(), targets_p, lse, losses, mean, rows,
                            vocab, stream.get());
  const auto* dloss_p = static_cast<const float*>(d_dloss.get());
  const std::vector<KernelVersion> backward = {
      {"loom",
       [&](cudaStream_t s) {
         kc::cross_entropy_backward(dtype, d_logits.get(), targets_p, lse, dloss_p, d_dlogits.get(),
                                    rows, vocab, s);
       }},
      {"loom in place (dlogits = logits)",
       [&](cudaStream_t s) {
         kc::cross_entropy_backward(dtype, d_dlogits.get(), targets_p, lse, dloss_p,
                                    d_dlogits.get(), rows, vocab, s);
       }},
  };
  for (size_t k = 0; k < backward.size(); ++k) {
    const KernelVersion& v = backward[k];
    std::printf(" backward %s\n", v.name);
    if (k == 0) {
      LOOM_CUDA_CHECK(cudaMemsetAsync(d_dlogits.get(), 0x7f, d_dlogits.bytes(), stream.get()));
    } else {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(d_dlogits.get(), d_logits.get(), d_logits.bytes(),
                                      cudaMemcpyDeviceToDevice, stream.get()));
    }
    v.launch(stream.get());
    const bool good = compare(download(d_dlogits, dtype, n), dlogits_ref, grad_tol, "dlogits").ok;
    ok &= good;
    // In place, repeated calls keep rewriting gradients of gradients: still finite, and the
    // traffic is the same, so the timing stands.
    if (good && timed) {
      report(shape_label("cross_entropy_backward", rows, vocab, dtype), v.name,
             time_ms(v.launch, stream.get()), es * 2.0 * n + 16.0 * rows, 0.0);
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
  bool ok = true;
  for (DType dtype : {DType::F32, DType::BF16}) {
    ok &= run_softmax(12 * 1024, 1024, /*causal=*/true, /*timed=*/true, dtype);
    ok &= run_softmax(64, 8192, /*causal=*/false, /*timed=*/true, dtype);  // block per row
    ok &= run_softmax(50, 25, /*causal=*/true, /*timed=*/false, dtype);    // scalar, partial
    ok &= run_softmax(33, 1001, /*causal=*/false, /*timed=*/false, dtype);
    ok &= run_cross_entropy(8 * 1024, 50304, /*timed=*/true, dtype);
    ok &= run_cross_entropy(7, 1001, /*timed=*/false, dtype);  // scalar path
  }
  std::printf("%s\n", ok ? "all versions validated" : "VALIDATION FAILED");
  return ok ? 0 : 1;
}
