#include "bench/cuda/lab.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"

namespace loom::lab {

namespace {

size_t storage_bytes(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16:
    case DType::F16: return 2;
    default:
      fail("[lab] host conversions take f32, bf16 or f16, got dtype #", static_cast<int>(dtype));
  }
}

// splitmix64: tiny, fast and identical everywhere.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills a device buffer with uniform values in [-1, 1) from a per-element hash, so the large
// operands of measured_limits() need no host round trip. (Zeros would flatter the GEMM: tensor
// cores draw less power on them and clock higher.)
template <typename T>
__global__ void fill_uniform_kernel(T* out, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    out[i] = kernels::cuda::from_float<T>(2.0f * u - 1.0f);
  }
}

// Milliseconds of one square n^3 GEMM (C = A B) in dtype on stream.
double time_square_gemm(DType dtype, int64_t n, cudaStream_t stream) {
  size_t bytes = static_cast<size_t>(n * n) * storage_bytes(dtype);
  DeviceBuffer a(bytes), b(bytes), c(bytes);
  fill_uniform(a.get(), dtype, static_cast<size_t>(n * n), 1, stream);
  fill_uniform(b.get(), dtype, static_cast<size_t>(n * n), 2, stream);
  return time_ms(
      [&](cudaStream_t s) {
        kernels::cuda::gemm(dtype, dtype, false, false, n, n, n, a.get(), n, 0, b.get(), n, 0,
                            c.get(), n, 0, 1, false, nullptr, nullptr, s);
      },
      stream, 3, 10);
}

DeviceLimits measure() {
  DeviceLimits limits{};
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  limits.name = prop.name;
  Stream stream;

  // Bandwidth: a D2D copy reads and writes every byte once. 1 GiB per buffer is far beyond
  // any L2, so this measures HBM; shrink on small devices.
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  size_t copy_bytes = std::min<size_t>(size_t{1} << 30, free_bytes / 4) & ~size_t{255};
  {
    DeviceBuffer src(copy_bytes), dst(copy_bytes);
    LOOM_CUDA_CHECK(cudaMemsetAsync(src.get(), 1, copy_bytes, stream.get()));
    double ms = time_ms(
        [&](cudaStream_t s) {
          LOOM_CUDA_CHECK(
              cudaMemcpyAsync(dst.get(), src.get(), copy_bytes, cudaMemcpyDeviceToDevice, s));
        },
        stream.get(), 3, 20);
    limits.bandwidth_gbs = 2.0 * static_cast<double>(copy_bytes) / (ms * 1e-3) / 1e9;
  }

  // Compute: 8192^3 GEMMs, large enough that cuBLASLt runs at its steady-state rate.
  constexpr int64_t kN = 8192;
  const double flops = 2.0 * kN * kN * kN;
  auto tflops = [&](double ms) { return flops / (ms * 1e-3) / 1e12; };
  bool saved_tf32 = kernels::cuda::allow_tf32();
  try {
    limits.bf16_tflops = tflops(time_square_gemm(DType::BF16, kN, stream.get()));
    kernels::cuda::set_allow_tf32(false);
    limits.f32_tflops = tflops(time_square_gemm(DType::F32, kN, stream.get()));
    kernels::cuda::set_allow_tf32(true);
    limits.tf32_tflops = tflops(time_square_gemm(DType::F32, kN, stream.get()));
  } catch (...) {
    kernels::cuda::set_allow_tf32(saved_tf32);
    throw;
  }
  kernels::cuda::set_allow_tf32(saved_tf32);

  std::printf(
      "device %d: %s, %d SMs; measured: copy %.0f GB/s, bf16 GEMM %.1f TFLOP/s, f32 GEMM %.1f "
      "TFLOP/s, tf32 GEMM %.1f TFLOP/s\n",
      device, prop.name, prop.multiProcessorCount, limits.bandwidth_gbs, limits.bf16_tflops,
      limits.f32_tflops, limits.tf32_tflops);
  return limits;
}

}  // namespace

bool gpu_available(std::string* why) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    (void)cudaGetLastError();  // leave no error behind for the next check
    return false;
  }
  if (count == 0) {
    if (why) *why = "the CUDA runtime reports 0 devices";
    return false;
  }
  return true;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> out(n);
  uint64_t state = seed;
  const float scale = (hi - lo) / 16777216.0f;  // 24 random bits -> [lo, hi)
  for (float& v : out)
    v = lo + static_cast<float>(splitmix64(state) >> 40) * scale;
  return out;
}

std::vector<float> rounded(const std::vector<float>& host, DType dtype) {
  std::vector<float> out(host.size());
  switch (dtype) {
    case DType::F32: out = host; break;
    case DType::BF16:
      for (size_t i = 0; i < host.size(); ++i)
        out[i] = bf16_bits_to_float(float_to_bf16_bits(host[i]));
      break;
    case DType::F16:
      for (size_t i = 0; i < host.size(); ++i)
        out[i] = f16_bits_to_float(float_to_f16_bits(host[i]));
      break;
    default: storage_bytes(dtype);  // throws naming the dtype
  }
  return out;
}

void fill_uniform(void* ptr, DType dtype, size_t count, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return;
  constexpr int kThreads = 256;
  int64_t n = static_cast<int64_t>(count);
  kernels::cuda::dispatch_float_storage(dtype, "fill_uniform", [&]<typename T>() {
    fill_uniform_kernel<T><<<kernels::cuda::grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(ptr), n, seed);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) LOOM_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_) LOOM_CUDA_WARN(cudaFree(ptr_));
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) LOOM_CUDA_WARN(cudaFree(ptr_));
}

DeviceBuffer upload(const std::vector<float>& host, DType dtype) {
  size_t es = storage_bytes(dtype);
  DeviceBuffer buf(host.size() * es);
  if (host.empty()) return buf;
  std::vector<unsigned char> bytes(host.size() * es);
  switch (dtype) {
    case DType::F32: std::memcpy(bytes.data(), host.data(), bytes.size()); break;
    case DType::BF16:
      for (size_t i = 0; i < host.size(); ++i) {
        uint16_t bits = float_to_bf16_bits(host[i]);
        std::memcpy(bytes.data() + 2 * i, &bits, 2);
      }
      break;
    default:  // F16
      for (size_t i = 0; i < host.size(); ++i) {
        uint16_t bits = float_to_f16_bits(host[i]);
        std::memcpy(bytes.data() + 2 * i, &bits, 2);
      }
      break;
  }
  LOOM_CUDA_CHECK(cudaMemcpy(buf.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  return buf;
}

std::vector<float> download(const DeviceBuffer& buf, DType dtype, size_t count) {
  size_t es = storage_bytes(dtype);
  if (count * es > buf.bytes()) {
    fail("[lab] download of ", count, " ", dtype_name(dtype), " elements (", count * es,
         " bytes) from a buffer of ", buf.bytes(), " bytes");
  }
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> out(count);
  if (count == 0) return out;
  std::vector<unsigned char> bytes(count * es);
  LOOM_CUDA_CHECK(cudaMemcpy(bytes.data(), buf.get(), bytes.size(), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits = 0;
    switch (dtype) {
      case DType::F32: std::memcpy(&out[i], bytes.data() + 4 * i, 4); break;
      case DType::BF16:
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        out[i] = bf16_bits_to_float(bits);
        break;
      default:  // F16
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        out[i] = f16_bits_to_float(bits);
        break;
    }
  }
  return out;
}

Stream::Stream() {
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  LOOM_CUDA_WARN(cudaStreamDestroy(stream_));
}

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::F32: return {1e-4, 1e-4};
    case DType::BF16: return {2e-2, 2e-2};
    case DType::F16: return {1e-2, 1e-2};
    default: storage_bytes(dtype); return {0, 0};  // storage_bytes throws naming the dtype
  }
}

Comparison compare(const std::vector<float>& got, const std::vector<float>& want, DType dtype,
                   const std::string& label) {
  return compare(got, want, default_tolerance(dtype), label);
}

Comparison compare(const std::vector<float>& got, const std::vector<float>& want,
                   Tolerance tolerance, const std::string& label) {
  Comparison result{0.0, 0.0, got.size() == want.size()};
  size_t first_bad = got.size();
  size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    double g = got[i], w = want[i];
    bool within;
    if (!std::isfinite(w) || !std::isfinite(g)) {
      within = (std::isnan(g) && std::isnan(w)) || g == w;
      if (!within) result.max_abs = result.max_rel = INFINITY;
    } else {
      double diff = std::abs(g - w);
      within = diff <= tolerance.abs + tolerance.rel * std::abs(w);
      result.max_abs = std::max(result.max_abs, diff);
      if (std::abs(w) >= tolerance.abs)
        result.max_rel = std::max(result.max_rel, diff / std::abs(w));
    }
    if (!within && first_bad == got.size()) first_bad = i;
    result.ok = result.ok && within;
  }
  std::printf("  check %s: max abs %.2e, max rel %.2e (tol %.0e abs + %.0e rel) %s", label.c_str(),
              result.max_abs, result.max_rel, tolerance.abs, tolerance.rel,
              result.ok ? "ok" : "FAILED");
  if (got.size() != want.size()) {
    std::printf(": got %zu elements, want %zu", got.size(), want.size());
  } else if (!result.ok) {
    std::printf(": first bad element [%zu] got %.6g want %.6g", first_bad,
                static_cast<double>(got[first_bad]), static_cast<double>(want[first_bad]));
  }
  std::printf("\n");
  return result;
}

double time_ms(const Launch& fn, cudaStream_t stream, int warmup,
               int repeats) {
  if (repeats < 1) fail("[lab] time_ms needs repeats >= 1, got ", repeats);
  struct Events {
    cudaEvent_t start = nullptr, stop = nullptr;
    Events() {
      LOOM_CUDA_CHECK(cudaEventCreate(&start));
      LOOM_CUDA_CHECK(cudaEventCreate(&stop));
    }
    ~Events() {
      LOOM_CUDA_WARN(cudaEventDestroy(start));
      LOOM_CUDA_WARN(cudaEventDestroy(stop));
    }
  } events;
  for (int i = 0; i < warmup; ++i)
    fn(stream);
  LOOM_CUDA_CHECK(cudaEventRecord(events.start, stream));
  for (int i = 0; i < repeats; ++i)
    fn(stream);
  LOOM_CUDA_CHECK(cudaEventRecord(events.stop, stream));
  LOOM_CUDA_CHECK(cudaEventSynchronize(events.stop));
  float ms = 0.0f;
  LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, events.start, events.stop));
  return static_cast<double>(ms) / repeats;
}

const DeviceLimits& measured_limits() {
  static const DeviceLimits limits = measure();
  return limits;
}

void report(const std::string& kernel, const std::string& version, double ms, double bytes,
            double flops, Peak peak) {
  const DeviceLimits& limits = measured_limits();
  char bw[64] = "        -            ";
  char fl[64] = "        -             ";
  if (bytes > 0) {
    double gbs = bytes / (ms * 1e-3) / 1e9;
    std::snprintf(bw, sizeof bw, "%8.1f GB/s %5.1f%% bw", gbs, 100.0 * gbs / limits.bandwidth_gbs);
  }
  if (flops > 0) {
    double tf = flops / (ms * 1e-3) / 1e12;
    double limit = peak == Peak::BF16  ? limits.bf16_tflops
                   : peak == Peak::F32 ? limits.f32_tflops
                                       : limits.tf32_tflops;
    const char* name = peak == Peak::BF16 ? "bf16" : peak == Peak::F32 ? "f32" : "tf32";
    std::snprintf(fl, sizeof fl, "%7.2f TFLOP/s %5.1f%% %s", tf, 100.0 * tf / limit, name);
  }
  std::printf("  %-34s | %-28s | %9.4f ms | %s | %s\n", kernel.c_str(), version.c_str(), ms, bw,
              fl);
}

}  // namespace loom::lab
