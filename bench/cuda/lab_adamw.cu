// Kernel lab: the AdamW update over a whole model's parameters (see bench/cuda/lab.h).
//
// Versions side by side:
//   v1 per-tensor launches of a plain one-element-per-thread kernel (lab-local; what a simple
//      optimizer loop does: one launch per parameter tensor)
//   v2 loom multi_tensor_adamw: chunk tables in the kernel's parameters, a few launches for the
//      whole model, 16-byte accesses
//   v3 loom multi_tensor_adamw with a device-side grad_scale (the unscale of mixed precision
//      folded into the update)
// Validation (before any timing), against kernels/cpu/optimizer_steps' adamw_step per tensor on
// the same rounded inputs: a set of 61 tensors chosen to exercise the corners of the chunking
// (1-element tensors, sizes one past a chunk, more tensors than one table holds, a tensor of
// more chunks than one launch holds, and one tensor at a misaligned address). For f32 the lab
// also prints how many elements are bitwise equal to the CPU's (all of them, when the CPU
// reference is compiled without FMA contraction).
// Timing: GPT-2 small's 148 parameter tensors (124M parameters) and 4096 tensors of 768
// elements (a launch-bound case), filled on the device; bytes = 7 accesses per element
// (read param, grad, exp_avg, exp_avg_sq; write param, exp_avg, exp_avg_sq).
//
// Build: nvcc -std=c++20 -arch=sm_90 --expt-relaxed-constexpr -I. bench/cuda/lab_adamw.cu
//   bench/cuda/lab.cu kernels/cuda/optimizer.cu kernels/cuda/gemm.cpp
//   kernels/cpu/optimizer_steps.cpp core/dtype.cpp core/error.cpp
//   kernels/cuda/cublaslt_library.cpp -ldl
// Run: ./lab_adamw   (prints "no CUDA device: ..." and exits 0 without a GPU)

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/cuda/lab.h"
#include "kernels/cpu/optimizer_steps.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optimizer.h"

namespace {

using loom::DType;
using namespace loom::lab;
namespace kc = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;


constexpr kc::AdamWArgs kArgs{
    .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1, .step = 7};

cpu::AdamWStepArgs cpu_args() {
  return {.lr = kArgs.lr,
          .beta1 = kArgs.beta1,
          .beta2 = kArgs.beta2,
          .eps = kArgs.eps,
          .weight_decay = kArgs.weight_decay,
          .step = kArgs.step};
}

// ---- v1: one launch per tensor, one element per thread --------------------------------------

struct SimpleScalars {
  float decay, beta1, beta2, step_size, bias_correction2_sqrt, eps;
};

SimpleScalars simple_scalars() {
  const double bc1 = 1.0 - std::pow(kArgs.beta1, static_cast<double>(kArgs.step));
  const double bc2 = 1.0 - std::pow(kArgs.beta2, static_cast<double>(kArgs.step));
  return {static_cast<float>(1.0 - kArgs.lr * kArgs.weight_decay),
          static_cast<float>(kArgs.beta1),
          static_cast<float>(kArgs.beta2),
          static_cast<float>(kArgs.lr / bc1),
          static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(kArgs.eps)};
}

template <typename T>
__global__ void adamw_simple(T* p, const T* g, T* m, T* v, int64_t n, SimpleScalars s) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float gi = kc::to_float(g[i]);
    const float mi = s.beta1 * kc::to_float(m[i]) + (1.0f - s.beta1) * gi;
    const float vi = s.beta2 * kc::to_float(v[i]) + (1.0f - s.beta2) * gi * gi;
    const float denom = sqrtf(vi) / s.bias_correction2_sqrt + s.eps;
    p[i] = kc::from_float<T>(kc::to_float(p[i]) * s.decay - s.step_size * mi / denom);
    m[i] = kc::from_float<T>(mi);
    v[i] = kc::from_float<T>(vi);
  }
}

void adamw_per_tensor(DType dtype, const std::vector<kc::AdamWTensor>& tensors,
                      cudaStream_t stream) {
  const SimpleScalars s = simple_scalars();
  kc::dispatch_float_storage(dtype, "adamw v1", [&]<typename T>() {
    for (const kc::AdamWTensor& t : tensors) {
      adamw_simple<T><<<kc::grid_for(t.n, 256), 256, 0, stream>>>(
          static_cast<T*>(t.param), static_cast<const T*>(t.grad), static_cast<T*>(t.exp_avg),
          static_cast<T*>(t.exp_avg_sq), t.n, s);
      LOOM_CUDA_CHECK_LAUNCH();
    }
  });
}

// ---- parameter sets -------------------------------------------------------------------------

// Tensors packed into one buffer per kind (param, grad, exp_avg, exp_avg_sq) at the same
// offsets: 64-element aligned, except `misaligned` (if >= 0), which sits one element later.
struct Layout {
  std::vector<int64_t> sizes, offsets;
  int64_t total = 0;
};

Layout make_layout(const std::vector<int64_t>& sizes, int misaligned) {
  Layout layout;
  layout.sizes = sizes;
  int64_t at = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    at = (at + 63) / 64 * 64 + (static_cast<int>(k) == misaligned ? 1 : 0);
    layout.offsets.push_back(at);
    at += sizes[k];
  }
  layout.total = at;
  return layout;
}

std::vector<int64_t> gpt2_small_sizes() {
  const int64_t c = 768;
  std::vector<int64_t> sizes = {50257 * c, 1024 * c};
  for (int layer = 0; layer < 12; ++layer) {
    for (int64_t n : {c, c, c * 3 * c, 3 * c, c * c, c, c, c, c * 4 * c, 4 * c, 4 * c * c, c})
      sizes.push_back(n);
  }
  sizes.push_back(c);
  sizes.push_back(c);
  return sizes;
}

// 61 tensors: odd sizes around the 65536-element chunk, more than one table's 48 tensors, and
// one tensor of more than 320 chunks (one launch's worth), so the table is cut mid-tensor.
std::vector<int64_t> validation_sizes() {
  std::vector<int64_t> sizes = {1, 3, 17, 768, 65535, 65536, 65537, 3 * 65536 + 5, 1000003};
  for (int k = 0; k < 50; ++k)
    sizes.push_back(100 + 37 * k);
  sizes.push_back(330 * 65536 + 123);
  sizes.push_back(2304);
  return sizes;
}

struct Buffers {
  DeviceBuffer param, grad, exp_avg, exp_avg_sq;
};

std::vector<kc::AdamWTensor> tensor_list(const Layout& layout, Buffers& b, DType dtype) {
  const size_t es = loom::dtype_size(dtype);
  auto at = [&](DeviceBuffer& buf, int64_t offset) {
    return static_cast<char*>(buf.get()) + static_cast<size_t>(offset) * es;
  };
  std::vector<kc::AdamWTensor> tensors;
  for (size_t k = 0; k < layout.sizes.size(); ++k) {
    const int64_t off = layout.offsets[k];
    tensors.push_back({at(b.param, off), at(b.grad, off), at(b.exp_avg, off), at(b.exp_avg_sq, off),
                       layout.sizes[k]});
  }
  return tensors;
}

// ---- validation -----------------------------------------------------------------------------

bool validate(DType dtype) {
  const Layout layout = make_layout(validation_sizes(), 7);
  const size_t total = static_cast<size_t>(layout.total), es = loom::dtype_size(dtype);
  std::printf("adamw validation: %zu tensors, %zu elements, %s\n", layout.sizes.size(), total,
              loom::dtype_name(dtype));
  const std::vector<float> p0 = rounded(random_floats(total, 1), dtype);
  const std::vector<float> g = rounded(random_floats(total, 2), dtype);
  const std::vector<float> m0 = rounded(random_floats(total, 3, -0.1f, 0.1f), dtype);
  const std::vector<float> v0 = rounded(random_floats(total, 4, 0.0f, 1e-3f), dtype);

  // CPU references: plain, and with the gradients scaled by 0.5 (exact in every dtype).
  std::vector<float> g_half(g);
  for (float& x : g_half)
    x *= 0.5f;
  struct Reference {
    std::vector<float> p, m, v;
  };
  auto reference = [&](const std::vector<float>& grads) {
    Reference r{p0, m0, v0};
    for (size_t k = 0; k < layout.sizes.size(); ++k) {
      const size_t off = static_cast<size_t>(layout.offsets[k]);
      cpu::adamw_step<float>(r.p.data() + off, grads.data() + off, r.m.data() + off,
                             r.v.data() + off, layout.sizes[k], cpu_args());
    }
    return r;
  };
  const Reference plain = reference(g), scaled = reference(g_half);

  Buffers pristine{upload(p0, dtype), upload(g, dtype), upload(m0, dtype), upload(v0, dtype)};
  Buffers work{DeviceBuffer(total * es), upload(g, dtype), DeviceBuffer(total * es),
               DeviceBuffer(total * es)};
  const std::vector<kc::AdamWTensor> tensors = tensor_list(layout, work, dtype);
  DeviceBuffer d_scale = upload({0.5f}, DType::F32);
  const auto* scale = static_cast<const float*>(d_scale.get());
  Stream stream;

  const Tolerance tol = dtype == DType::F32 ? Tolerance{1e-6, 1e-5} : Tolerance{1e-6, 2e-2};
  struct Version {
    const char* name;
    std::function<void(cudaStream_t)> launch;
    const Reference* want;
  };
  const std::vector<Version> versions = {
      {"v1 per-tensor launches", [&](cudaStream_t s) { adamw_per_tensor(dtype, tensors, s); },
       &plain},
      {"v2 loom multi-tensor",
       [&](cudaStream_t s) {
         kc::multi_tensor_adamw(dtype, tensors.data(), static_cast<int>(tensors.size()), kArgs,
                                nullptr, s);
       },
       &plain},
      {"v3 loom multi-tensor, grad_scale 0.5",
       [&](cudaStream_t s) {
         kc::multi_tensor_adamw(dtype, tensors.data(), static_cast<int>(tensors.size()), kArgs,
                                scale, s);
       },
       &scaled},
  };
  bool ok = true;
  for (const Version& v : versions) {
    std::printf(" %s\n", v.name);
    const size_t bytes = total * es;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(work.param.get(), pristine.param.get(), bytes,
                                    cudaMemcpyDeviceToDevice, stream.get()));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(work.exp_avg.get(), pristine.exp_avg.get(), bytes,
                                    cudaMemcpyDeviceToDevice, stream.get()));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(work.exp_avg_sq.get(), pristine.exp_avg_sq.get(), bytes,
                                    cudaMemcpyDeviceToDevice, stream.get()));
    v.launch(stream.get());
    const std::vector<float> p = download(work.param, dtype, total);
    ok &= compare(p, v.want->p, tol, "param").ok;
    ok &= compare(download(work.exp_avg, dtype, total), v.want->m, tol, "exp_avg").ok;
    ok &= compare(download(work.exp_avg_sq, dtype, total), v.want->v, tol, "exp_avg_sq").ok;
    if (dtype == DType::F32) {
      size_t same = 0;
      for (size_t i = 0; i < total; ++i)
        same += p[i] == v.want->p[i];
      std::printf("  param bitwise equal to the CPU: %zu of %zu\n", same, total);
    }
  }
  return ok;
}

// ---- timing ---------------------------------------------------------------------------------

void time_set(const char* name, const std::vector<int64_t>& sizes, DType dtype) {
  const Layout layout = make_layout(sizes, -1);
  const size_t total = static_cast<size_t>(layout.total), es = loom::dtype_size(dtype);
  Stream stream;
  Buffers b{DeviceBuffer(total * es), DeviceBuffer(total * es), DeviceBuffer(total * es),
            DeviceBuffer(total * es)};
  fill_uniform(b.param.get(), dtype, total, 1, stream.get());
  fill_uniform(b.grad.get(), dtype, total, 2, stream.get());
  fill_uniform(b.exp_avg.get(), dtype, total, 3, stream.get());
  LOOM_CUDA_CHECK(cudaMemsetAsync(b.exp_avg_sq.get(), 0, total * es, stream.get()));
  const std::vector<kc::AdamWTensor> tensors = tensor_list(layout, b, dtype);
  DeviceBuffer d_scale = upload({0.5f}, DType::F32);
  const auto* scale = static_cast<const float*>(d_scale.get());
  const std::string kernel = std::string("adamw ") + name + " (" + std::to_string(sizes.size()) +
                             " tensors, " + std::to_string(total) + ") " + loom::dtype_name(dtype);
  const double bytes = 7.0 * static_cast<double>(es) * static_cast<double>(total);
  const int count = static_cast<int>(tensors.size());
  report(kernel, "v1 per-tensor launches",
         time_ms([&](cudaStream_t s) { adamw_per_tensor(dtype, tensors, s); }, stream.get()), bytes,
         0.0);
  report(kernel, "v2 loom multi-tensor",
         time_ms(
             [&](cudaStream_t s) {
               kc::multi_tensor_adamw(dtype, tensors.data(), count, kArgs, nullptr, s);
             },
             stream.get()),
         bytes, 0.0);
  report(kernel, "v3 loom multi-tensor, grad_scale",
         time_ms(
             [&](cudaStream_t s) {
               kc::multi_tensor_adamw(dtype, tensors.data(), count, kArgs, scale, s);
             },
             stream.get()),
         bytes, 0.0);
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
  for (DType dtype : {DType::F32, DType::BF16})
    ok &= validate(dtype);
  if (!ok) {
    std::printf("VALIDATION FAILED\n");
    return 1;
  }
  for (DType dtype : {DType::F32, DType::BF16}) {
    time_set("gpt2-small", gpt2_small_sizes(), dtype);
    time_set("many-small", std::vector<int64_t>(4096, 768), dtype);
  }
  std::printf("all versions validated\n");
  return 0;
}
