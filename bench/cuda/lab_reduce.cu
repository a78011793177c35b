// Kernel lab: deterministic reductions (see bench/cuda/lab.h for the framework).
//
// Versions side by side, each validated against kernels/cpu/reduce (and optimizer_steps for
// the sum of squares) on the same (rounded) random inputs before it is timed:
//   sum_axis, rows (inner == 1)
//     v1 thread per row (lab-local: one sequential loop per output, uncoalesced)
//     v2 warp per row (lab-local)
//     v3 block per row, 512 threads (lab-local)
//     v4 loom (warp per row below 2048 elements, block per row above)
//   sum_axis, columns (inner > 1, e.g. a bias gradient summed over the batch)
//     v1 thread per column (lab-local: coalesced, but only `inner` threads)
//     v2 loom (32 columns x up to 16 row groups per block, fixed-order tree)
//   max_axis: loom, with NaNs planted at d = 0 and d > 0 (argmax must equal the CPU's exactly)
//   sum_all and sum_of_squares
//     v1 one block of 1024 threads (lab-local)
//     v2 loom (up to 1024 blocks of partials, then one block; 16-byte loads)
// Every loom version is also run twice and must give the same bits.
//
// Build: nvcc -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I. bench/cuda/lab_reduce.cu
//   bench/cuda/lab.cu kernels/cuda/reduce.cu kernels/cuda/gemm.cpp kernels/cpu/reduce.cpp
//   kernels/cpu/optimizer_steps.cpp core/dtype.cpp core/error.cpp
//   kernels/cuda/cublaslt_library.cpp -ldl
// Run: ./lab_reduce   (prints "no CUDA device: ..." and exits 0 without a GPU)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/optimizer_steps.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.h"

namespace {

using loom::DType;
using namespace loom::lab;
namespace kc = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;



// ---- lab-local versions (f32 accumulation) --------------------------------------------------

template <typename T>
__global__ void rows_thread_per_row(const T* x, T* out, int64_t rows, int64_t extent) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (row >= rows) return;
  float s = 0.0f;
  for (int64_t d = 0; d < extent; ++d)
    s += kc::to_float(x[row * extent + d]);
  out[row] = kc::from_float<T>(s);
}

template <typename T>
__global__ void rows_warp_per_row(const T* x, T* out, int64_t rows, int64_t extent) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float s = 0.0f;
  for (int64_t d = lane; d < extent; d += 32)
    s += kc::to_float(x[row * extent + d]);
  s = kc::warp_sum(s);
  if (lane == 0) out[row] = kc::from_float<T>(s);
}

template <typename T>
__global__ void rows_block_per_row(const T* x, T* out, int64_t extent) {
  __shared__ float scratch[32];
  const T* src = x + blockIdx.x * extent;
  float s = 0.0f;
  for (int64_t d = threadIdx.x; d < extent; d += blockDim.x)
    s += kc::to_float(src[d]);
  s = kc::block_sum(s, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = kc::from_float<T>(s);
}

template <typename T>
__global__ void columns_thread_per_column(const T* x, T* out, int64_t outer, int64_t extent,
                                          int64_t inner) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= inner) return;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    float s = 0.0f;
    for (int64_t d = 0; d < extent; ++d)
      s += kc::to_float(x[(o * extent + d) * inner + i]);
    out[o * inner + i] = kc::from_float<T>(s);
  }
}

template <typename T, bool kSquare, typename Out>
__global__ void sum_one_block(const T* x, int64_t n, Out* out) {
  __shared__ float scratch[32];
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = kc::to_float(x[i]);
    s += kSquare ? v * v : v;
  }
  s = kc::block_sum(s, scratch);
  if (threadIdx.x == 0) *out = kc::from_float<Out>(s);
}

// ---- helpers ------------------------------------------------------------------------------

// Validates every version (output poisoned first), checks loom versions for bitwise
// determinism, then times.
bool run_versions(const std::string& kernel, const std::vector<KernelVersion>& versions,
                  DeviceBuffer& out, DType dtype, size_t count, const std::vector<float>& want,
                  Tolerance tol, bool timed, double bytes, Stream& stream) {
  bool ok = true;
  for (const KernelVersion& v : versions) {
    std::printf(" %s %s\n", kernel.c_str(), v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(out.get(), 0x7f, out.bytes(), stream.get()));
    v.launch(stream.get());
    const std::vector<float> got = download(out, dtype, count);
    bool good = compare(got, want, tol, kernel).ok;
    if (std::string(v.name).find("loom") != std::string::npos) {
      v.launch(stream.get());
      // Compared as bits: a NaN output (max_axis propagates NaN) never equals itself as a float.
      const std::vector<float> again = download(out, dtype, count);
      const bool same = std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) == 0;
      std::printf("  check bitwise equal on a second run: %s\n", same ? "ok" : "FAILED");
      good &= same;
    }
    ok &= good;
    if (good && timed) report(kernel, v.name, time_ms(v.launch, stream.get()), bytes, 0.0);
  }
  return ok;
}

// The reference sums in double (on the same rounded inputs), so what is left is the kernel's
// own f32 rounding, which grows like sqrt(extent).
std::vector<float> sum_axis_reference(const std::vector<float>& x, int64_t outer, int64_t extent,
                                      int64_t inner) {
  const std::vector<double> xd(x.begin(), x.end());
  std::vector<double> out(static_cast<size_t>(outer * inner));
  cpu::sum_axis<double>(xd.data(), out.data(), outer, extent, inner);
  return std::vector<float>(out.begin(), out.end());
}

Tolerance sum_tolerance(DType dtype, int64_t extent) {
  if (dtype != DType::F32) return default_tolerance(dtype);
  return Tolerance{1e-5 * std::sqrt(static_cast<double>(extent)), 1e-4};
}

std::string shape_tag(int64_t outer, int64_t extent, int64_t inner, DType dtype) {
  return " [" + std::to_string(outer) + "," + std::to_string(extent) + "," + std::to_string(inner) +
         "] " + loom::dtype_name(dtype);
}

// ---- sum_axis -----------------------------------------------------------------------------

bool run_sum_rows(int64_t rows, int64_t extent, DType dtype, bool timed) {
  const size_t n = static_cast<size_t>(rows * extent), es = loom::dtype_size(dtype);
  const std::vector<float> x = rounded(random_floats(n, 1), dtype);
  const std::vector<float> want = sum_axis_reference(x, rows, extent, 1);
  DeviceBuffer d_x = upload(x, dtype), d_out(static_cast<size_t>(rows) * es);
  Stream stream;
  const std::string tag = shape_tag(rows, extent, 1, dtype);
  std::printf("sum_axis rows%s\n", tag.c_str());
  auto local = [&](auto launch) {
    return [&, launch](cudaStream_t s) {
      kc::dispatch_float_storage(dtype, "lab", [&]<typename T>() {
        launch.template operator()<T>(static_cast<const T*>(d_x.get()),
                                      static_cast<T*>(d_out.get()), s);
        LOOM_CUDA_CHECK_LAUNCH();
      });
    };
  };
  const std::vector<KernelVersion> versions = {
      {"v1 thread per row", local([&]<typename T>(const T* x_, T* out, cudaStream_t s) {
         rows_thread_per_row<T><<<kc::grid_for(rows, 128), 128, 0, s>>>(x_, out, rows, extent);
       })},
      {"v2 warp per row", local([&]<typename T>(const T* x_, T* out, cudaStream_t s) {
         rows_warp_per_row<T>
             <<<static_cast<unsigned>(kc::ceil_div(rows, 8)), 256, 0, s>>>(x_, out, rows, extent);
       })},
      {"v3 block per row", local([&]<typename T>(const T* x_, T* out, cudaStream_t s) {
         rows_block_per_row<T><<<static_cast<unsigned>(rows), 512, 0, s>>>(x_, out, extent);
       })},
      {"v4 loom",
       [&](cudaStream_t s) {
         kc::sum_axis(dtype, dtype, d_x.get(), d_out.get(), rows, extent, 1, nullptr, s);
       }}};
  return run_versions("sum_axis" + tag, versions, d_out, dtype, static_cast<size_t>(rows), want,
                      sum_tolerance(dtype, extent), timed, es * (n + rows), stream);
}

bool run_sum_columns(int64_t outer, int64_t extent, int64_t inner, DType dtype, bool timed) {
  const size_t n = static_cast<size_t>(outer * extent * inner), es = loom::dtype_size(dtype);
  const size_t outputs = static_cast<size_t>(outer * inner);
  const std::vector<float> x = rounded(random_floats(n, 2), dtype);
  const std::vector<float> want = sum_axis_reference(x, outer, extent, inner);
  DeviceBuffer d_x = upload(x, dtype), d_out(outputs * es);
  DeviceBuffer d_ws(kc::sum_axis_workspace_bytes(dtype, outer, extent, inner));
  Stream stream;
  const std::string tag = shape_tag(outer, extent, inner, dtype);
  std::printf("sum_axis columns%s\n", tag.c_str());
  const std::vector<KernelVersion> versions = {
      {"v1 thread per column",
       [&](cudaStream_t s) {
         kc::dispatch_float_storage(dtype, "lab", [&]<typename T>() {
           const dim3 grid(static_cast<unsigned>(kc::ceil_div(inner, 128)),
                           static_cast<unsigned>(std::min<int64_t>(outer, 65535)));
           columns_thread_per_column<T><<<grid, 128, 0, s>>>(static_cast<const T*>(d_x.get()),
                                                             static_cast<T*>(d_out.get()), outer,
                                                             extent, inner);
           LOOM_CUDA_CHECK_LAUNCH();
         });
       }},
      {"v2 loom (32 columns x 16 row groups; 256-row chunks from 1024 rows)",
       [&](cudaStream_t s) {
         kc::sum_axis(dtype, dtype, d_x.get(), d_out.get(), outer, extent, inner, d_ws.get(), s);
       }}};
  return run_versions("sum_axis" + tag, versions, d_out, dtype, outputs, want,
                      sum_tolerance(dtype, extent), timed, es * (n + outputs), stream);
}

// ---- max_axis -----------------------------------------------------------------------------

bool run_max(int64_t outer, int64_t extent, int64_t inner, DType dtype, bool timed) {
  const size_t n = static_cast<size_t>(outer * extent * inner), es = loom::dtype_size(dtype);
  const size_t outputs = static_cast<size_t>(outer * inner);
  // Few distinct values, so ties are common and "first maximal index" is tested.
  std::vector<float> x = rounded(random_floats(n, 3, -8.0f, 8.0f), dtype);
  for (float& v : x)
    v = std::floor(v);
  // NaN at d = 0 of output 0 (must win), and at d = extent - 1 of output 1 (must be ignored).
  x[0] = NAN;
  if (outputs > 1) x[static_cast<size_t>(((extent - 1) * inner) + (inner > 1 ? 1 : extent))] = NAN;
  std::vector<float> want(outputs);
  std::vector<int64_t> want_index(outputs);
  cpu::max_axis<float>(x.data(), want.data(), want_index.data(), outer, extent, inner);
  DeviceBuffer d_x = upload(x, dtype), d_out(outputs * es), d_index(outputs * 8);
  Stream stream;
  const std::string tag = shape_tag(outer, extent, inner, dtype);
  std::printf("max_axis%s\n", tag.c_str());
  const Launch loom_max = [&](cudaStream_t s) {
    kc::max_axis(dtype, d_x.get(), d_out.get(), static_cast<int64_t*>(d_index.get()), outer, extent,
                 inner, s);
  };
  bool ok = run_versions("max_axis" + tag, {{"loom", loom_max}}, d_out, dtype, outputs, want,
                         Tolerance{0.0, 0.0}, false, 0.0, stream);
  std::vector<int64_t> got_index(outputs);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  LOOM_CUDA_CHECK(cudaMemcpy(got_index.data(), d_index.get(), outputs * 8, cudaMemcpyDeviceToHost));
  size_t mismatches = 0;
  for (size_t k = 0; k < outputs; ++k)
    mismatches += got_index[k] != want_index[k];
  std::printf("  check argmax equal to the CPU's: %zu mismatches %s\n", mismatches,
              mismatches == 0 ? "ok" : "FAILED");
  ok &= mismatches == 0;
  if (ok && timed) {
    report("max_axis" + tag, "loom", time_ms(loom_max, stream.get()),
           static_cast<double>(es * n + (es + 8) * outputs), 0.0);
  }
  return ok;
}

// ---- sum_all and sum_of_squares -------------------------------------------------------------

bool run_sum_all(int64_t n, DType dtype, bool timed) {
  const size_t count = static_cast<size_t>(n), es = loom::dtype_size(dtype);
  // Non-negative values: no cancellation, so a relative tolerance is meaningful.
  const std::vector<float> x = rounded(random_floats(count, 4, 0.0f, 1.0f), dtype);
  const std::vector<float> want_sum = {static_cast<float>(cpu::sum_all<float>(x.data(), n))};
  const std::vector<float> want_sq = {static_cast<float>(cpu::sum_of_squares<float>(x.data(), n))};
  DeviceBuffer d_x = upload(x, dtype), d_sum(8), d_sq(4);
  DeviceBuffer d_ws(kc::reduce_workspace_bytes(n));
  Stream stream;
  const std::string tag = " n=" + std::to_string(n) + " " + loom::dtype_name(dtype);
  std::printf("sum_all / sum_of_squares%s\n", tag.c_str());
  const Tolerance f32_tol{0.0, 1e-4};
  const Tolerance sum_tol = dtype == DType::F32 ? f32_tol : default_tolerance(dtype);
  auto one_block = [&]<bool kSquare>(void* out, cudaStream_t s) {
    kc::dispatch_float_storage(dtype, "lab", [&]<typename T>() {
      if constexpr (kSquare) {
        sum_one_block<T, true, float>
            <<<1, 1024, 0, s>>>(static_cast<const T*>(d_x.get()), n, static_cast<float*>(out));
      } else {
        sum_one_block<T, false, T>
            <<<1, 1024, 0, s>>>(static_cast<const T*>(d_x.get()), n, static_cast<T*>(out));
      }
      LOOM_CUDA_CHECK_LAUNCH();
    });
  };
  bool ok = run_versions(
      "sum_all" + tag,
      {{"v1 one block",
        [&](cudaStream_t s) { one_block.template operator()<false>(d_sum.get(), s); }},
       {"v2 loom (partials + finish)",
        [&](cudaStream_t s) { kc::sum_all(dtype, d_x.get(), n, d_sum.get(), d_ws.get(), s); }}},
      d_sum, dtype, 1, want_sum, sum_tol, timed, static_cast<double>(es) * n, stream);
  ok &= run_versions(
      "sum_of_squares" + tag,
      {{"v1 one block",
        [&](cudaStream_t s) { one_block.template operator()<true>(d_sq.get(), s); }},
       {"v2 loom (partials + finish)",
        [&](cudaStream_t s) {
          kc::sum_of_squares(dtype, d_x.get(), n, static_cast<float*>(d_sq.get()), d_ws.get(), s);
        }}},
      d_sq, DType::F32, 1, want_sq, f32_tol, timed, static_cast<double>(es) * n, stream);
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
    ok &= run_sum_rows(8192, 768, dtype, true);        // short rows: warp per row
    ok &= run_sum_rows(256, 65536, dtype, true);       // long rows: block per row
    ok &= run_sum_rows(37, 2049, dtype, false);        // odd sizes
    ok &= run_sum_columns(1, 8192, 768, dtype, true);   // bias gradient of [8192, 768]
    ok &= run_sum_columns(1, 8192, 3072, dtype, true);  // ... and of the MLP's [8192, 3072]
    ok &= run_sum_columns(64, 128, 1024, dtype, true);
    ok &= run_sum_columns(3, 5, 1001, dtype, false);
    ok &= run_max(8192, 768, 1, dtype, true);
    ok &= run_max(16, 512, 1000, dtype, true);
    ok &= run_max(3, 7, 5, dtype, false);
    ok &= run_sum_all(64 << 20, dtype, true);
    ok &= run_sum_all(1000003, dtype, false);
    ok &= run_sum_all(17, dtype, false);
  }
  std::printf("%s\n", ok ? "all versions validated" : "VALIDATION FAILED");
  return ok ? 0 : 1;
}
