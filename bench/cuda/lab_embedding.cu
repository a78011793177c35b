// Kernel lab: embedding lookup and its deterministic gradient (see bench/cuda/lab.h).
//
// Versions side by side, each validated against kernels/cpu/embedding on the same (rounded)
// random inputs before it is timed:
//   forward  v1 one thread per element, scalar (lab-local)
//            v2 loom: one warp per looked-up row, 16-byte packs
//   backward v1 one thread per column walking all positions in order (lab-local: atomic-free
//               and deterministic, but only `width` threads)
//            v2 loom: stable radix sort of (index, position), then one thread per (run of equal
//               indices, column pack)
// The loom backward adds in the CPU kernel's order of positions, in f32 starting from the
// current dweight, so f32 results must equal the CPU's bitwise and bf16 results must equal the
// CPU's f32 result rounded once: the checks use zero tolerance. (v1 does the same in f32; in
// bf16 it rounds after every addition, so it runs for f32 only.)
// Shapes: GPT-2 small token embedding (8192 tokens, 50304 x 768), with Zipf-like skewed indices
// (long runs of repeated tokens) and with uniform indices; an odd shape (scalar path).
//
// Build: nvcc -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I. bench/cuda/lab_embedding.cu
//   bench/cuda/lab.cu kernels/cuda/embedding.cu kernels/cuda/gemm.cpp kernels/cpu/embedding.cpp
//   core/dtype.cpp (+ core/error.cpp)
//   kernels/cuda/cublaslt_library.cpp -ldl
// Run: ./lab_embedding   (prints "no CUDA device: ..." and exits 0 without a GPU)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding.h"

namespace {

using loom::DType;
using namespace loom::lab;
namespace kc = loom::kernels::cuda;



// ---- v1 forward: thread per element ---------------------------------------------------------

template <typename T>
__global__ void gather_per_element(const int64_t* indices, const T* weight, T* out, int64_t count,
                                   int64_t width) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count * width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / width, c = i % width;
    out[i] = weight[indices[n] * width + c];
  }
}

void forward_v1(DType dtype, const int64_t* indices, const void* weight, void* out, int64_t count,
                int64_t width, cudaStream_t stream) {
  kc::dispatch_float_storage(dtype, "forward_v1", [&]<typename T>() {
    gather_per_element<T><<<kc::grid_for(count * width, 256), 256, 0, stream>>>(
        indices, static_cast<const T*>(weight), static_cast<T*>(out), count, width);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// ---- v1 backward: thread per column, all positions in order --------------------------------

template <typename T>
__global__ void scatter_per_column(const int64_t* indices, const T* dout, T* dweight, int64_t count,
                                   int64_t width) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= width) return;
  for (int64_t n = 0; n < count; ++n) {
    T* dst = dweight + indices[n] * width + c;
    *dst = kc::from_float<T>(kc::to_float(*dst) + kc::to_float(dout[n * width + c]));
  }
}

void backward_v1(DType dtype, const int64_t* indices, const void* dout, void* dweight,
                 int64_t count, int64_t width, cudaStream_t stream) {
  kc::dispatch_float_storage(dtype, "backward_v1", [&]<typename T>() {
    scatter_per_column<T><<<static_cast<unsigned>(kc::ceil_div(width, 128)), 128, 0, stream>>>(
        indices, static_cast<const T*>(dout), static_cast<T*>(dweight), count, width);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

// ---- one shape ----------------------------------------------------------------------------

struct Shape {
  int64_t count, width, vocab;
  bool skewed;  // Zipf-like indices (many repeats) instead of uniform ones
  bool timed;
};

bool run_shape(const Shape& shape, DType dtype) {
  const int64_t count = shape.count, width = shape.width, vocab = shape.vocab;
  std::vector<int64_t> indices(count);
  {
    const std::vector<float> u = random_floats(count, 31, 0.0f, 1.0f);
    for (int64_t n = 0; n < count; ++n) {
      const double p = shape.skewed ? std::pow(static_cast<double>(u[n]), 4.0) : u[n];
      indices[n] = std::min<int64_t>(vocab - 1, static_cast<int64_t>(p * vocab));
    }
  }
  const size_t distinct = std::set<int64_t>(indices.begin(), indices.end()).size();
  std::printf("embedding %lld tokens, %lld x %lld, %s indices (%zu distinct) %s\n",
              static_cast<long long>(count), static_cast<long long>(vocab),
              static_cast<long long>(width), shape.skewed ? "skewed" : "uniform", distinct,
              loom::dtype_name(dtype));

  const size_t table = static_cast<size_t>(vocab * width),
               rows = static_cast<size_t>(count * width);
  const std::vector<float> weight = rounded(random_floats(table, 32), dtype);
  const std::vector<float> dout = rounded(random_floats(rows, 33), dtype);
  const std::vector<float> dweight0 = rounded(random_floats(table, 34), dtype);  // accumulated into
  std::vector<float> out_ref(rows), dweight_ref = dweight0;
  loom::kernels::cpu::embedding_forward<float>(indices.data(), weight.data(), out_ref.data(), count,
                                               width, vocab);
  loom::kernels::cpu::embedding_backward<float>(indices.data(), dout.data(), dweight_ref.data(),
                                                count, width, vocab);
  dweight_ref = rounded(dweight_ref, dtype);  // the device rounds the f32 sum once

  DeviceBuffer d_weight = upload(weight, dtype), d_dout = upload(dout, dtype);
  DeviceBuffer d_dweight0 = upload(dweight0, dtype), d_dweight(table * loom::dtype_size(dtype));
  DeviceBuffer d_out(rows * loom::dtype_size(dtype));
  DeviceBuffer d_indices(count * sizeof(int64_t));
  LOOM_CUDA_CHECK(
      cudaMemcpy(d_indices.get(), indices.data(), d_indices.bytes(), cudaMemcpyHostToDevice));
  DeviceBuffer d_ws(kc::embedding_backward_workspace(count));
  const auto* idx = static_cast<const int64_t*>(d_indices.get());
  Stream stream;
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // uploads are done before the stream reads them
  const double es = static_cast<double>(loom::dtype_size(dtype));
  const std::string label = std::to_string(count) + " tok " + std::to_string(vocab) + "x" +
                            std::to_string(width) + (shape.skewed ? " skewed " : " uniform ") +
                            loom::dtype_name(dtype);
  bool ok = true;

  const std::vector<KernelVersion> forward = {
      {"v1 thread per element",
       [&](cudaStream_t s) {
         forward_v1(dtype, idx, d_weight.get(), d_out.get(), count, width, s);
       }},
      {"v2 loom (warp per row, 16 B)",
       [&](cudaStream_t s) {
         kc::embedding_forward(dtype, idx, d_weight.get(), d_out.get(), count, width, vocab, s);
       }},
  };
  for (const KernelVersion& v : forward) {
    std::printf(" forward %s\n", v.name);
    LOOM_CUDA_CHECK(cudaMemsetAsync(d_out.get(), 0, d_out.bytes(), stream.get()));
    v.launch(stream.get());
    const bool good = compare(download(d_out, dtype, rows), out_ref, Tolerance{0, 0}, "out").ok;
    ok &= good;
    if (good && shape.timed) {
      report("embedding_forward " + label, v.name, time_ms(v.launch, stream.get()),
             2.0 * es * rows + 8.0 * count, 0.0);
    }
  }

  const std::vector<KernelVersion> backward = {
      {"v1 thread per column",
       [&](cudaStream_t s) {
         backward_v1(dtype, idx, d_dout.get(), d_dweight.get(), count, width, s);
       }},
      {"v2 loom (sort + runs)",
       [&](cudaStream_t s) {
         kc::embedding_backward(dtype, idx, d_dout.get(), d_dweight.get(), count, width, vocab,
                                d_ws.get(), s);
       }},
  };
  // Minimum traffic: dout and the indices once, each touched dweight row read and written.
  const double backward_bytes = es * rows + 8.0 * count + 2.0 * es * distinct * width;
  for (const KernelVersion& v : backward) {
    std::printf(" backward %s\n", v.name);
    if (&v == &backward[0] && dtype != DType::F32) {
      std::printf("  skipped: v1 rounds dweight to %s after every addition\n", loom::dtype_name(dtype));
      continue;
    }
    LOOM_CUDA_CHECK(cudaMemcpyAsync(d_dweight.get(), d_dweight0.get(), d_dweight0.bytes(),
                                    cudaMemcpyDeviceToDevice, stream.get()));
    v.launch(stream.get());
    const bool good =
        compare(download(d_dweight, dtype, table), dweight_ref, Tolerance{0, 0}, "dweight").ok;
    ok &= good;
    // Repeated calls keep accumulating into dweight: the traffic is the same.
    if (good && shape.timed) {
      report("embedding_backward " + label, v.name, time_ms(v.launch, stream.get()), backward_bytes,
             0.0);
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
  const Shape shapes[] = {{8 * 1024, 768, 50304, true, true},
                          {8 * 1024, 768, 50304, false, true},
                          {1000, 13, 97, true, false}};
  bool ok = true;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (const Shape& shape : shapes)
      ok &= run_shape(shape, dtype);
  }
  std::printf("%s\n", ok ? "all versions validated" : "VALIDATION FAILED");
  return ok ? 0 : 1;
}
