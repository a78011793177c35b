#pragma once
// The kernel-lab framework shared by bench/cuda/lab_*.cu (in the spirit of llm.c dev/cuda):
// each lab runs several versions of one kernel family side by side, validates every version
// against the CPU kernel from kernels/cpu on random data BEFORE timing it, then times it with
// CUDA events and reports GB/s and TFLOP/s as a share of what this device measurably does.
//
//   using namespace loom::lab;
//   std::string why;
//   if (!gpu_available(&why)) return std::printf("no CUDA device: %s\n", why.c_str()), 0;
//   std::vector<float> x = random_floats(n, /*seed=*/1);
//   DeviceBuffer dx = upload(x, DType::BF16), dy(n * 2);
//   Stream stream;
//   ... launch on stream.get(), and compute `want` on the CPU from rounded(x, DType::BF16) ...
//   compare(download(dy, DType::BF16, n), want, DType::BF16, "v1");
//   double ms = time_ms([&](cudaStream_t s) { launch(..., s); }, stream.get());
//   report("layer_norm 8192x768 bf16", "v1 warp per row", ms, bytes, flops);
//
// Everything here is for single-threaded lab programs: functions block (they synchronise the
// device where they say so) and throw loom::Error on CUDA failures. Labs link
// core/dtype.cpp (host conversions) and kernels/cuda/gemm.cpp (measured_limits() times
// cuBLASLt GEMMs) with kernels/cuda/cublaslt_library.cpp (which loads cuBLASLt), plus cudart
// and -ldl.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom::lab {

// True when the CUDA runtime finds a driver and at least one device. Never throws; on false,
// *why (when not null) says what is missing, e.g. "cudaErrorNoDevice: no CUDA-capable device
// is detected".
bool gpu_available(std::string* why);

// n uniform values in [lo, hi) from a fixed generator: the same seed gives the same values on
// every machine.
std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// host rounded to dtype and back (round-to-nearest-even), i.e. exactly the values that
// upload(host, dtype) puts on the device. CPU references take these as inputs so that the
// comparison measures the kernel, not the input rounding.
std::vector<float> rounded(const std::vector<float>& host, DType dtype);

// Device memory from cudaMalloc, freed on destruction (errors there are only warned).
// Move-only. A zero-byte buffer holds a null pointer.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* get() { return ptr_; }
  const void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A device buffer holding host converted to dtype (F32, BF16 or F16; round-to-nearest-even).
// Blocks until the copy is done.
DeviceBuffer upload(const std::vector<float>& host, DType dtype);
// The first count elements of buf (stored as dtype) as floats. Synchronises the whole device
// first, so work queued on any stream has finished before the copy.
std::vector<float> download(const DeviceBuffer& buf, DType dtype, size_t count);

// Fills count elements of dtype at ptr (device memory) with uniform values in [-1, 1) from a
// hash of (index, seed), on the device, asynchronously on stream. For large benchmark
// operands that need no CPU reference (not the same values as random_floats).
void fill_uniform(void* ptr, DType dtype, size_t count, uint64_t seed, cudaStream_t stream);

// A non-blocking CUDA stream on the current device, destroyed on destruction.
class Stream {
 public:
  Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// Element-wise acceptance: |got - want| <= abs + rel * |want| for every element (numpy's
// allclose), and non-finite values must match exactly (NaN with NaN, inf with same-sign inf).
struct Tolerance {
  double abs;
  double rel;
};
// f32: 1e-4 abs + 1e-4 rel (f32 kernels differ from the CPU only by summation order);
// bf16: 2e-2 + 2e-2 (8-bit mantissa: one output rounding is up to 2^-9 relative, plus inputs
// and intermediates rounded on the way); f16: 1e-2 + 1e-2 (11-bit mantissa). Kernels with
// long reductions in low precision, or TF32, pass their own Tolerance.
Tolerance default_tolerance(DType dtype);

struct Comparison {
  double max_abs;  // max |got - want|
  double max_rel;  // max |got - want| / |want| over elements with |want| >= tol.abs
  bool ok;         // sizes equal and every element within tolerance
};
// Compares and prints one line:
//   "  check <label>: max abs 3.1e-06, max rel 2.0e-06 (tol 1e-04 abs + 1e-04 rel) ok"
// On failure the line ends in "FAILED" plus the first bad element (index, got, want).
Comparison compare(const std::vector<float>& got, const std::vector<float>& want, DType dtype,
                   const std::string& label = "output");
Comparison compare(const std::vector<float>& got, const std::vector<float>& want,
                   Tolerance tolerance, const std::string& label = "output");

// Work a lab launches on a stream (without synchronising), and one named version of a kernel.
using Launch = std::function<void(cudaStream_t)>;
struct KernelVersion {
  const char* name;
  Launch launch;
};

// Milliseconds per call of fn, which launches its work on `stream` (and must not synchronise):
// `warmup` untimed calls, then `repeats` calls between two events. Synchronises the stream.
double time_ms(const Launch& fn, cudaStream_t stream, int warmup = 3, int repeats = 20);

// What the current device measurably does (measured once, on first use, and printed):
// bandwidth_gbs from a large cudaMemcpyAsync device-to-device (read + write bytes counted),
// the TFLOP/s from 8192^3 cuBLASLt GEMMs through kernels::cuda::gemm: bf16 inputs with f32
// accumulation, f32 with TF32 off (plain FMA) and f32 with TF32 on.
struct DeviceLimits {
  double bandwidth_gbs;
  double bf16_tflops;
  double f32_tflops;
  double tf32_tflops;
  std::string name;
};
const DeviceLimits& measured_limits();

// Which measured compute limit report() divides by.
enum class Peak { BF16, F32, TF32 };

// Prints one fixed-format line (bytes and flops are totals per call; 0 prints "-"):
//   "  <kernel> | <version> | 0.1234 ms | 2345.6 GB/s  78.1% bw | 123.45 TFLOP/s  21.3% bf16"
// bytes should be the minimum traffic the kernel must do (each input read once, each output
// written once), so that % of bandwidth says how close the kernel is to the memory limit.
void report(const std::string& kernel, const std::string& version, double ms, double bytes,
            double flops, Peak peak = Peak::BF16);

}  // namespace loom::lab
