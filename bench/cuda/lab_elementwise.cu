// Kernel lab: elementwise kernels (see bench/cuda/lab.h for the framework).
//
// Versions side by side, each validated against kernels/cpu/elementwise on the same (rounded)
// random inputs before it is timed:
//   add, gelu forward, gelu backward
//     v1 scalar: one element per thread and access (lab-local, the textbook kernel)
//     v2 loom: 16-byte loads and stores (4 f32 / 8 bf16 per access), scalar tail
//   broadcast add [R, C] + [C] and add with a transposed operand: loom's strided kernel
//   copy_strided: attention's head split [B, T, H, D] -> [B, H, T, D] (loom, strided kernel)
//   f32 -> bf16 conversion: v1 scalar (lab-local) vs v2 loom (8 elements per access)
//   fill: loom (16-byte stores)
// Sizes: 16M elements (timed) and 1,000,003 elements at a pointer offset by one element
// (validation only: exercises the scalar path and the tails).
//
// Build: nvcc -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I. bench/cuda/lab_elementwise.cu
//   bench/cuda/lab.cu kernels/cuda/elementwise.cu kernels/cuda/copy.cu kernels/cuda/gemm.cpp
//   kernels/cpu/elementwise.cpp core/dtype.cpp core/error.cpp
//   kernels/cuda/cublaslt_library.cpp -ldl
// Run: ./lab_elementwise   (prints "no CUDA device: ..." and exits 0 without a GPU)

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/copy.h"
#include "kernels/cuda/elementwise.h"

namespace {

using loom::DType;
using namespace loom::lab;
namespace kc = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;



// ---- v1 kernels: one element per thread and access ------------------------------------------

template <typename T>
__global__ void add_scalar_loads(const T* a, const T* b, T* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = kc::from_float<T>(kc::to_float(a[i]) + kc::to_float(b[i]));
}

constexpr float kC = 0.7978845608028654f, kK = 0.044715f;

template <typename T>
__global__ void gelu_forward_scalar_loads(const T* x, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = kc::to_float(x[i]);
    y[i] = kc::from_float<T>(0.5f * v * (1.0f + tanhf(kC * (v + kK * v * v * v))));
  }
}

template <typename T>
__global__ void gelu_backward_scalar_loads(const T* x, const T* dy, T* dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = kc::to_float(x[i]);
    const float t = tanhf(kC * (v + kK * v * v * v));
    const float grad =
        0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kC * (1.0f + 3.0f * kK * v * v);
    dx[i] = kc::from_float<T>(kc::to_float(dy[i]) * grad);
  }
}

__global__ void convert_scalar_loads(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

// Launches a lab-local kernel over n elements, for the dtype's storage type.
template <typename Kernel>
void launch_v1(DType dtype, int64_t n, cudaStream_t stream, Kernel&& kernel) {
  kc::dispatch_float_storage(dtype, "lab v1", [&]<typename T>() {
    kernel.template operator()<T>(kc::grid_for(n, 256), 256, stream);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// Runs versions of one kernel: each is validated (output zeroed first), then timed if asked.
bool run_versions(const std::string& kernel, const std::vector<KernelVersion>& versions,
                  DeviceBuffer& out, DType dtype, size_t count, size_t offset,
                  const std::vector<float>& want, bool timed, double bytes, Stream& stream) {
  bool ok = true;
  for (const KernelVersion& v : versions) {
    std::printf(" %s %s\n", kernel.c_str(), v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(out.get(), 0, out.bytes(), stream.get()));
    v.launch(stream.get());
    std::vector<float> got = download(out, dtype, offset + count);
    got.erase(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(offset));
    const bool good = compare(got, want, dtype, kernel).ok;
    ok &= good;
    if (good && timed) report(kernel, v.name, time_ms(v.launch, stream.get()), bytes, 0.0);
  }
  return ok;
}

// ---- add and gelu on flat buffers ---------------------------------------------------------

// `offset` elements in front of every operand: 1 makes every pointer misaligned for 16-byte
// accesses, so loom's kernels take their scalar path.
bool run_flat(int64_t n, size_t offset, DType dtype, bool timed) {
  const size_t count = static_cast<size_t>(n), es = loom::dtype_size(dtype);
  std::printf("elementwise n=%lld %s%s\n", static_cast<long long>(n), loom::dtype_name(dtype),
              offset ? " (misaligned by one element)" : "");
  auto padded = [&](std::vector<float> v) {
    v.insert(v.begin(), offset, 0.0f);
    return v;
  };
  const std::vector<float> a = rounded(random_floats(count, 1, -3.0f, 3.0f), dtype);
  const std::vector<float> b = rounded(random_floats(count, 2, 0.5f, 2.0f), dtype);
  DeviceBuffer d_a = upload(padded(a), dtype), d_b = upload(padded(b), dtype);
  DeviceBuffer d_out((count + offset) * es);
  Stream stream;
  const char* pa = static_cast<const char*>(d_a.get()) + offset * es;
  const char* pb = static_cast<const char*>(d_b.get()) + offset * es;
  char* po = static_cast<char*>(d_out.get()) + offset * es;
  const std::string tag = " n=" + std::to_string(n) + " " + loom::dtype_name(dtype);
  bool ok = true;

  // add (and the other three ops, validated through loom's contiguous path)
  const int64_t one = 1;
  std::vector<float> want(count);
  cpu::binary<float>(cpu::BinaryOp::Add, 1, &n, a.data(), &one, b.data(), &one, want.data());
  ok &= run_versions(
      "add" + tag,
      {{"v1 scalar",
        [&](cudaStream_t s) {
          launch_v1(dtype, n, s, [&]<typename T>(unsigned grid, int threads, cudaStream_t st) {
            add_scalar_loads<T><<<grid, threads, 0, st>>>(reinterpret_cast<const T*>(pa),
                                                          reinterpret_cast<const T*>(pb),
                                                          reinterpret_cast<T*>(po), n);
          });
        }},
       {"v2 loom (16-byte vectors)",
        [&](cudaStream_t s) {
          kc::binary(kc::BinaryOp::Add, dtype, 1, &n, pa, &one, pb, &one, po, s);
        }}},
      d_out, dtype, count, offset, want, timed, 3.0 * es * n, stream);
  const struct {
    cpu::BinaryOp c;
    kc::BinaryOp g;
    const char* name;
  } ops[] = {{cpu::BinaryOp::Sub, kc::BinaryOp::Sub, "sub"},
             {cpu::BinaryOp::Mul, kc::BinaryOp::Mul, "mul"},
             {cpu::BinaryOp::Div, kc::BinaryOp::Div, "div"}};
  for (const auto& op : ops) {
    cpu::binary<float>(op.c, 1, &n, a.data(), &one, b.data(), &one, want.data());
    ok &= run_versions(
        op.name + tag,
        {{"loom",
          [&](cudaStream_t s) { kc::binary(op.g, dtype, 1, &n, pa, &one, pb, &one, po, s); }}},
        d_out, dtype, count, offset, want, false, 0.0, stream);
  }

  // gelu forward
  cpu::gelu_forward<float>(a.data(), want.data(), n);
  ok &= run_versions(
      "gelu_forward" + tag,
      {{"v1 scalar",
        [&](cudaStream_t s) {
          launch_v1(dtype, n, s, [&]<typename T>(unsigned grid, int threads, cudaStream_t st) {
            gelu_forward_scalar_loads<T><<<grid, threads, 0, st>>>(reinterpret_cast<const T*>(pa),
                                                                   reinterpret_cast<T*>(po), n);
          });
        }},
       {"v2 loom (16-byte vectors)",
        [&](cudaStream_t s) { kc::gelu_forward(dtype, pa, po, n, s); }}},
      d_out, dtype, count, offset, want, timed, 2.0 * es * n, stream);

  // gelu backward (b plays dy)
  cpu::gelu_backward<float>(a.data(), b.data(), want.data(), n);
  ok &= run_versions(
      "gelu_backward" + tag,
      {{"v1 scalar",
        [&](cudaStream_t s) {
          launch_v1(dtype, n, s, [&]<typename T>(unsigned grid, int threads, cudaStream_t st) {
            gelu_backward_scalar_loads<T><<<grid, threads, 0, st>>>(reinterpret_cast<const T*>(pa),
                                                                    reinterpret_cast<const T*>(pb),
                                                                    reinterpret_cast<T*>(po), n);
          });
        }},
       {"v2 loom (16-byte vectors)",
        [&](cudaStream_t s) { kc::gelu_backward(dtype, pa, pb, po, n, s); }}},
      d_out, dtype, count, offset, want, timed, 3.0 * es * n, stream);

  // scalar forms (loom only)
  cpu::scale<float>(a.data(), 0.25f, want.data(), n);
  ok &= run_versions("scale" + tag,
                     {{"loom", [&](cudaStream_t s) { kc::scale(dtype, pa, 0.25, po, n, s); }}},
                     d_out, dtype, count, offset, want, false, 0.0, stream);
  cpu::add_scalar<float>(a.data(), 1.5f, want.data(), n);
  ok &= run_versions("add_scalar" + tag,
                     {{"loom", [&](cudaStream_t s) { kc::add_scalar(dtype, pa, 1.5, po, n, s); }}},
                     d_out, dtype, count, offset, want, false, 0.0, stream);
  return ok;
}

// ---- broadcasting and transposed operands ---------------------------------------------------

bool run_broadcast(int64_t rows, int64_t cols, DType dtype, bool timed) {
  const size_t count = static_cast<size_t>(rows * cols), es = loom::dtype_size(dtype);
  std::printf("broadcast [%lld, %lld] %s\n", static_cast<long long>(rows),
              static_cast<long long>(cols), loom::dtype_name(dtype));
  const std::vector<float> a = rounded(random_floats(count, 3), dtype);
  const std::vector<float> bias = rounded(random_floats(static_cast<size_t>(cols), 4), dtype);
  const std::vector<float> at = rounded(random_floats(count, 5), dtype);  // [cols, rows]
  DeviceBuffer d_a = upload(a, dtype), d_bias = upload(bias, dtype), d_at = upload(at, dtype);
  DeviceBuffer d_out(count * es);
  Stream stream;
  const int64_t shape[2] = {rows, cols};
  const int64_t row_major[2] = {cols, 1}, row_bcast[2] = {0, 1}, transposed[2] = {1, rows};
  const std::string tag =
      " [" + std::to_string(rows) + "," + std::to_string(cols) + "] " + loom::dtype_name(dtype);
  std::vector<float> want(count);
  bool ok = true;

  cpu::binary<float>(cpu::BinaryOp::Add, 2, shape, a.data(), row_major, bias.data(), row_bcast,
                     want.data());
  ok &= run_versions("add bias" + tag,
                     {{"loom strided",
                       [&](cudaStream_t s) {
                         kc::binary(kc::BinaryOp::Add, dtype, 2, shape, d_a.get(), row_major,
                                    d_bias.get(), row_bcast, d_out.get(), s);
                       }}},
                     d_out, dtype, count, 0, want, timed,
                     es * (2.0 * static_cast<double>(count) + cols), stream);

  cpu::binary<float>(cpu::BinaryOp::Mul, 2, shape, a.data(), row_major, at.data(), transposed,
                     want.data());
  ok &= run_versions("mul a * b^T" + tag,
                     {{"loom strided",
                       [&](cudaStream_t s) {
                         kc::binary(kc::BinaryOp::Mul, dtype, 2, shape, d_a.get(), row_major,
                                    d_at.get(), transposed, d_out.get(), s);
                       }}},
                     d_out, dtype, count, 0, want, timed, 3.0 * es * count, stream);
  return ok;
}

// ---- copies, conversions, fills -------------------------------------------------------------

bool run_copies(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, DType dtype,
                bool timed) {
  const int64_t n = batch * seq * heads * head_dim;
  const size_t count = static_cast<size_t>(n), es = loom::dtype_size(dtype);
  std::printf("copies [%lld, %lld, %lld, %lld] %s\n", static_cast<long long>(batch),
              static_cast<long long>(seq), static_cast<long long>(heads),
              static_cast<long long>(head_dim), loom::dtype_name(dtype));
  const std::vector<float> x = rounded(random_floats(count, 6, -4.0f, 4.0f), dtype);
  DeviceBuffer d_x = upload(x, dtype), d_out(count * es);
  Stream stream;
  const std::string tag = " " + std::to_string(n) + " " + loom::dtype_name(dtype);
  bool ok = true;

  // [B, T, H, D] read as [B, H, T, D]: the head split before attention.
  const int64_t shape[4] = {batch, heads, seq, head_dim};
  const int64_t strides[4] = {seq * heads * head_dim, head_dim, heads * head_dim, 1};
  std::vector<float> want(count);
  cpu::copy_strided(sizeof(float), 4, shape, x.data(), strides, want.data());
  ok &=
      run_versions("copy_strided head split" + tag,
                   {{"loom strided",
                     [&](cudaStream_t s) {
                       kc::copy_strided(dtype, 4, shape, d_x.get(), strides, dtype, d_out.get(), s);
                     }}},
                   d_out, dtype, count, 0, want, timed, 2.0 * es * n, stream);

  // Conversion to bf16 must be bitwise the host's round-to-nearest-even.
  if (dtype == DType::F32) {
    const std::vector<float> want_bf16 = rounded(x, DType::BF16);
    DeviceBuffer d_bf16(count * 2);
    const int64_t one = 1;
    const std::vector<KernelVersion> versions = {
        {"v1 scalar",
         [&](cudaStream_t s) {
           convert_scalar_loads<<<kc::grid_for(n, 256), 256, 0, s>>>(
               static_cast<const float*>(d_x.get()), static_cast<__nv_bfloat16*>(d_bf16.get()), n);
           LOOM_CUDA_CHECK_LAUNCH();
         }},
        {"v2 loom (8 per access)", [&](cudaStream_t s) {
           kc::copy_strided(DType::F32, 1, &n, d_x.get(), &one, DType::BF16, d_bf16.get(), s);
         }}};
    for (const KernelVersion& v : versions) {
      std::printf(" convert f32->bf16 %s\n", v.name);
      LOOM_CUDA_CHECK(cudaMemsetAsync(d_bf16.get(), 0, d_bf16.bytes(), stream.get()));
      v.launch(stream.get());
      const bool good =
          compare(download(d_bf16, DType::BF16, count), want_bf16, Tolerance{0.0, 0.0}, "bitwise")
              .ok;
      ok &= good;
      if (good && timed) {
        report("convert f32->bf16" + tag, v.name, time_ms(v.launch, stream.get()), 6.0 * n, 0.0);
      }
    }
  }

  const std::vector<float> want_fill(count, 0.1f);
  ok &= run_versions(
      "fill" + tag,
      {{"loom (16-byte stores)", [&](cudaStream_t s) { kc::fill(dtype, d_out.get(), 0.1, n, s); }}},
      d_out, dtype, count, 0, rounded(want_fill, dtype), timed, static_cast<double>(es) * n,
      stream);
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
    ok &= run_flat(16 << 20, 0, dtype, true);
    ok &= run_flat(1000003, 1, dtype, false);
    ok &= run_broadcast(8192, 3072, dtype, true);
    ok &= run_broadcast(37, 771, dtype, false);
    ok &= run_copies(8, 1024, 12, 64, dtype, true);
    ok &= run_copies(3, 17, 5, 7, dtype, false);
  }
  std::printf("%s\n", ok ? "all versions validated" : "VALIDATION FAILED");
  return ok ? 0 : 1;
}
