// Kernel lab: layer norm forward and backward (see bench/cuda/lab.h for the framework).
//
// Versions side by side, each validated against kernels/cpu/layer_norm on the same (rounded)
// random inputs before it is timed:
//   forward  v1 block per row, scalar loads, rsqrtf (lab-local, the textbook kernel)
//            v2 loom: warp per row (block per row for wide rows), 16-byte loads
//   backward v1 two kernels (lab-local): dx with a warp per row, then dweight/dbias with one
//               thread per column walking all rows (deterministic, little parallelism)
//            v2 loom: one pass over 16-row chunks writing dx and per-chunk f32 partial sums,
//               then a fixed-order sum of the partials
// Shapes: GPT-2 small (8192 x 768, timed), a wide row (512 x 8192, timed: the block-per-row
// path) and an odd shape (37 x 771, validation only: scalar path, partial chunk).
//
// Build: nvcc -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I. bench/cuda/lab_layer_norm.cu
//   bench/cuda/lab.cu kernels/cuda/layer_norm.cu kernels/cuda/gemm.cpp kernels/cpu/layer_norm.cpp
//   core/dtype.cpp (+ core/error.cpp)
//   kernels/cuda/cublaslt_library.cpp -ldl
// Run: ./lab_layer_norm   (prints "no CUDA device: ..." and exits 0 without a GPU)

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layer_norm.h"

namespace {

using loom::DType;
using namespace loom::lab;
namespace kc = loom::kernels::cuda;

constexpr double kEps = 1e-5;


// ---- v1 forward: block per row, scalar loads ----------------------------------------------

template <typename T>
__global__ void forward_block_per_row(const T* x, const T* weight, const T* bias, T* y, float* mean,
                                      float* rstd, int width, float eps) {
  __shared__ float scratch[kc::kWarpSize];
  const T* xr = x + static_cast<int64_t>(blockIdx.x) * width;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < width; i += blockDim.x)
    sum += kc::to_float(xr[i]);
  const float m = kc::block_sum(sum, scratch) / width;
  float sq = 0.0f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const float d = kc::to_float(xr[i]) - m;
    sq += d * d;
  }
  const float s = rsqrtf(kc::block_sum(sq, scratch) / width + eps);
  T* yr = y + static_cast<int64_t>(blockIdx.x) * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    yr[i] = kc::from_float<T>((kc::to_float(xr[i]) - m) * s * kc::to_float(weight[i]) +
                              kc::to_float(bias[i]));
  }
  if (threadIdx.x == 0) {
    mean[blockIdx.x] = m;
    rstd[blockIdx.x] = s;
  }
}

void forward_v1(DType dtype, const void* x, const void* w, const void* b, void* y, float* mean,
                float* rstd, int64_t rows, int64_t width, cudaStream_t stream) {
  kc::dispatch_float_storage(dtype, "forward_v1", [&]<typename T>() {
    forward_block_per_row<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b),
        static_cast<T*>(y), mean, rstd, static_cast<int>(width), static_cast<float>(kEps));
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// ---- v1 backward: dx warp per row, then one thread per column for dweight/dbias ---------------

template <typename T>
__global__ void backward_dx_warp_per_row(const T* dy, const T* x, const T* weight,
                                         const float* mean, const float* rstd, T* dx, int64_t rows,
                                         int width) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * width;
  const T* dyr = dy + row * width;
  const float m = mean[row], s = rstd[row];
  float a = 0.0f, b = 0.0f;
  for (int i = lane; i < width; i += 32) {
    const float xhat = (kc::to_float(xr[i]) - m) * s;
    const float dxhat = kc::to_float(dyr[i]) * kc::to_float(weight[i]);
    a += dxhat;
    b += dxhat * xhat;
  }
  a = kc::warp_sum(a) / width;
  b = kc::warp_sum(b) / width;
  for (int i = lane; i < width; i += 32) {
    const float xhat = (kc::to_float(xr[i]) - m) * s;
    const float dxhat = kc::to_float(dyr[i]) * kc::to_float(weight[i]);
    dx[row * width + i] = kc::from_float<T>(s * (dxhat - a - xhat * b));
  }
}

template <typename T>
__global__ void backward_params_per_column(const T* dy, const T* x, const float* mean,
                                           const float* rstd, T* dweight, T* dbias, int64_t rows,
                                           int width) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= width) return;
  float dw = 0.0f, db = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const float g = kc::to_float(dy[r * width + c]);
    dw += g * (kc::to_float(x[r * width + c]) - mean[r]) * rstd[r];
    db += g;
  }
  dweight[c] = kc::from_float<T>(dw);
  dbias[c] = kc::from_float<T>(db);
}

void backward_v1(DType dtype, const void* dy, const void* x, const void* w, const float* mean,
                 const float* rstd, void* dx, void* dw, void* db, int64_t rows, int64_t width,
                 cudaStream_t stream) {
  kc::dispatch_float_storage(dtype, "backward_v1", [&]<typename T>() {
    const int wd = static_cast<int>(width);
    backward_dx_warp_per_row<T><<<static_cast<unsigned>(kc::ceil_div(rows, 8)), 256, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(w), mean, rstd,
        static_cast<T*>(dx), rows, wd);
    LOOM_CUDA_CHECK_LAUNCH();
    backward_params_per_column<T>
        <<<static_cast<unsigned>(kc::ceil_div(width, 128)), 128, 0, stream>>>(
            static_cast<const T*>(dy), static_cast<const T*>(x), mean, rstd, static_cast<T*>(dw),
            static_cast<T*>(db), rows, wd);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// ---- one shape ----------------------------------------------------------------------------

struct Shape {
  int64_t rows, width;
  bool timed;
};

// Runs every version on one shape and dtype; returns false when any validation failed.
bool run_shape(const Shape& shape, DType dtype) {
  const int64_t rows = shape.rows, width = shape.width;
  const size_t n = static_cast<size_t>(rows * width);
  std::printf("layer_norm %lld x %lld %s\n", static_cast<long long>(rows),
              static_cast<long long>(width), loom::dtype_name(dtype));

  // Inputs as the device sees them (rounded to dtype), and the CPU reference on those.
  const std::vector<float> x = rounded(random_floats(n, 1, -2.0f, 2.0f), dtype);
  const std::vector<float> w = rounded(random_floats(width, 2, 0.5f, 1.5f), dtype);
  const std::vector<float> b = rounded(random_floats(width, 3), dtype);
  const std::vector<float> dy = rounded(random_floats(n, 4), dtype);
  std::vector<float> y_ref(n), mean_ref(rows), rstd_ref(rows);
  loom::kernels::cpu::layer_norm_forward<float>(x.data(), w.data(), b.data(), y_ref.data(),
                                                mean_ref.data(), rstd_ref.data(), rows, width,
                                                kEps);
  std::vector<float> dx_ref(n), dw_ref(width, 0.0f), db_ref(width, 0.0f);
  loom::kernels::cpu::layer_norm_backward<float>(dy.data(), x.data(), w.data(), mean_ref.data(),
                                                 rstd_ref.data(), dx_ref.data(), dw_ref.data(),
                                                 db_ref.data(), rows, width);

  DeviceBuffer d_x = upload(x, dtype), d_w = upload(w, dtype), d_b = upload(b, dtype);
  DeviceBuffer d_dy = upload(dy, dtype);
  DeviceBuffer d_y(n * loom::dtype_size(dtype)), d_dx(n * loom::dtype_size(dtype));
  DeviceBuffer d_dw(width * loom::dtype_size(dtype)), d_db(width * loom::dtype_size(dtype));
  DeviceBuffer d_mean(rows * sizeof(float)), d_rstd(rows * sizeof(float));
  DeviceBuffer d_ws(kc::layer_norm_backward_workspace(rows, width));
  auto* mean = static_cast<float*>(d_mean.get());
  auto* rstd = static_cast<float*>(d_rstd.get());
  Stream stream;
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // uploads are done before the stream reads them

  // mean/rstd are f32 whatever the dtype, and computed from the same rounded inputs.
  const Tolerance stats_tol = default_tolerance(DType::F32);
  // dweight/dbias add `rows` terms: f32 order differences grow with sqrt(rows).
  const Tolerance param_tol = dtype == DType::F32
                                  ? Tolerance{1e-4 * std::sqrt(static_cast<double>(rows)), 1e-4}
                                  : default_tolerance(dtype);
  const double es = static_cast<double>(loom::dtype_size(dtype));
  bool ok = true;

  const std::vector<KernelVersion> forward = {
      {"v1 block per row, scalar",
       [&](cudaStream_t s) {
         forward_v1(dtype, d_x.get(), d_w.get(), d_b.get(), d_y.get(), mean, rstd, rows, width, s);
       }},
      {"v2 loom",
       [&](cudaStream_t s) {
         kc::layer_norm_forward(dtype, dtype, d_x.get(), d_w.get(), d_b.get(), d_y.get(), mean, rstd,
                                rows, width, kEps, s);
       }},
  };
  const double forward_bytes = es * (2.0 * n + 2.0 * width) + 8.0 * rows;
  for (const KernelVersion& v : forward) {
    std::printf(" forward %s\n", v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_y.get(), 0, d_y.bytes(), stream.get()));
    v.launch(stream.get());
    bool good = compare(download(d_y, dtype, n), y_ref, dtype, "y").ok;
    good &= compare(download(d_mean, DType::F32, rows), mean_ref, stats_tol, "mean").ok;
    good &= compare(download(d_rstd, DType::F32, rows), rstd_ref, stats_tol, "rstd").ok;
    ok &= good;
    if (good && shape.timed) {
      report("layer_norm_forward " + std::to_string(rows) + "x" + std::to_string(width) + " " +
                 loom::dtype_name(dtype),
             v.name, time_ms(v.launch, stream.get()), forward_bytes, 0.0);
    }
  }

  // Backward reads the reference mean/rstd so that each version is checked on its own.
  DeviceBuffer d_mean_ref = upload(mean_ref, DType::F32), d_rstd_ref = upload(rstd_ref, DType::F32);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto* mref = static_cast<const float*>(d_mean_ref.get());
  const auto* rref = static_cast<const float*>(d_rstd_ref.get());
  const std::vector<KernelVersion> backward = {
      {"v1 dx warp/row + params thread/column",
       [&](cudaStream_t s) {
         backward_v1(dtype, d_dy.get(), d_x.get(), d_w.get(), mref, rref, d_dx.get(), d_dw.get(),
                     d_db.get(), rows, width, s);
       }},
      {"v2 loom (16-row chunks + partials)",
       [&](cudaStream_t s) {
         kc::layer_norm_backward(dtype, dtype, d_dy.get(), d_x.get(), d_w.get(), mref, rref,
                                 d_dx.get(), d_dw.get(), d_db.get(), rows, width, d_ws.get(), s);
       }},
  };
  const double backward_bytes = es * (3.0 * n + 3.0 * width) + 8.0 * rows;
  for (const KernelVersion& v : backward) {
    std::printf(" backward %s\n", v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_dx.get(), 0, d_dx.bytes(), stream.get()));
    // Garbage in dweight/dbias: the kernels must overwrite, not accumulate.
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_dw.get(), 0x7f, d_dw.bytes(), stream.get()));
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_db.get(), 0x7f, d_db.bytes(), stream.get()));
    v.launch(stream.get());
    bool good = compare(download(d_dx, dtype, n), dx_ref, dtype, "dx").ok;
    const std::vector<float> dw = download(d_dw, dtype, width);
    good &= compare(dw, dw_ref, param_tol, "dweight").ok;
    good &= compare(download(d_db, dtype, width), db_ref, param_tol, "dbias").ok;
    // Determinism: a second run gives the same bits.
    v.launch(stream.get());
    const std::vector<float> dw_again = download(d_dw, dtype, width);
    const bool same = dw == dw_again;
    std::printf("  check dweight bitwise equal on a second run: %s\n", same ? "ok" : "FAILED");
    good &= same;
    ok &= good;
    if (good && shape.timed) {
      report("layer_norm_backward " + std::to_string(rows) + "x" + std::to_string(width) + " " +
                 loom::dtype_name(dtype),
             v.name, time_ms(v.launch, stream.get()), backward_bytes, 0.0);
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
  const Shape shapes[] = {{8 * 1024, 768, true}, {512, 8192, true}, {37, 771, false}};
  bool ok = true;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const Shape& shape : shapes)
      ok &= run_shape(shape, dtype);
  }
  std::printf("%s\n", ok ? "all versions validated" : "VALIDATION FAILED");
  return ok ? 0 : 1;
}
