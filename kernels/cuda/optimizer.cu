#include "kernels/cuda/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/chunk_plan.cuh"
#include "kernels/cuda/common.cuh"

// The update of many tensors in a few launches: Note [Multi-tensor launches] in chunk_plan.cuh.

namespace loom::kernels::cuda {

namespace {

// ---------------------------------------------------------------------------------------------
// AdamW.

template <typename C>
struct AdamWScalars {
  C decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps,
      neg_step_size;
};

// As kernels/cpu/optimizer_steps.cpp's adamw_step: double on the host, rounded to C once.
template <typename C>
AdamWScalars<C> adamw_scalars(const AdamWArgs& args) {
  const double step = static_cast<double>(args.step);
  const double bias_correction1 = 1.0 - std::pow(args.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(args.beta2, step);
  AdamWScalars<C> s;
  s.decay = static_cast<C>(1.0 - args.lr * args.weight_decay);
  s.beta1 = static_cast<C>(args.beta1);
  s.one_minus_beta1 = static_cast<C>(1.0 - args.beta1);
  s.beta2 = static_cast<C>(args.beta2);
  s.one_minus_beta2 = static_cast<C>(1.0 - args.beta2);
  s.bias_correction2_sqrt = static_cast<C>(std::sqrt(bias_correction2));
  s.eps = static_cast<C>(args.eps);
  s.neg_step_size = static_cast<C>(-(args.lr / bias_correction1));
  return s;
}

// One element, statement by statement as the CPU's adamw_loop (torch's op order).
template <typename C>
__device__ __forceinline__ void adamw_update(C& p, C g, C& m, C& v, const AdamWScalars<C>& s) {
  const C pi = mul_rn(p, s.decay);                                        // p *= 1 - lr*wd
  const C mi = add_rn(mul_rn(m, s.beta1), mul_rn(s.one_minus_beta1, g));  // m = b1 m + (1-b1) g
  const C vi = add_rn(mul_rn(v, s.beta2), mul_rn(mul_rn(s.one_minus_beta2, g), g));
  const C denom = add_rn(div_rn(sqrt_rn(vi), s.bias_correction2_sqrt), s.eps);
  m = mi;
  v = vi;
  p = add_rn(pi, div_rn(mul_rn(s.neg_step_size, mi), denom));  // addcdiv_(m, denom, -step)
}

constexpr int64_t kChunk = 65536;  // elements per block; a multiple of kIlp
constexpr int kAdamThreads = 512;
constexpr int kIlp = 4;  // elements per thread per step (one 16-byte access for f32)

struct ChunkTable {
  void* param[kMaxChunkTensors];
  const void* grad[kMaxChunkTensors];
  void* exp_avg[kMaxChunkTensors];
  void* exp_avg_sq[kMaxChunkTensors];
  int64_t n[kMaxChunkTensors];
  ChunkPlan plan;
};
static_assert(sizeof(ChunkTable) + sizeof(AdamWScalars<double>) + 2 * sizeof(void*) <=
              kMaxKernelParameterBytes);

template <typename T>
struct alignas(kIlp * sizeof(T)) Pack {
  T v[kIlp];
};

template <typename T>
__global__ void __launch_bounds__(kAdamThreads)
    adamw_kernel(const __grid_constant__ ChunkTable table, const AdamWScalars<Acc<T>> args_scalars,
                 const float* grad_scale, const AdamWScalars<Acc<T>>* device_scalars) {
  using C = Acc<T>;
  const AdamWScalars<C> s = device_scalars != nullptr ? *device_scalars : args_scalars;
  const int t = table.plan.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(table.plan.block_chunk[blockIdx.x]) * kChunk;
  const int64_t len = table.n[t] - start < kChunk ? table.n[t] - start : kChunk;
  T* p = static_cast<T*>(table.param[t]) + start;
  const T* g = static_cast<const T*>(table.grad[t]) + start;
  T* m = static_cast<T*>(table.exp_avg[t]) + start;
  T* v = static_cast<T*>(table.exp_avg_sq[t]) + start;
  const bool scaled = grad_scale != nullptr;
  const C scale = scaled ? static_cast<C>(*grad_scale) : C(1);

  // kChunk is a multiple of kIlp, so the chunk's start keeps the tensor's alignment.
  const uintptr_t any = reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                        reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v);
  const int64_t packs = any % sizeof(Pack<T>) == 0 ? len / kIlp : 0;
  for (int64_t k = threadIdx.x; k < packs; k += blockDim.x) {
    Pack<T> pp = reinterpret_cast<const Pack<T>*>(p)[k];
    const Pack<T> gp = reinterpret_cast<const Pack<T>*>(g)[k];
    Pack<T> mp = reinterpret_cast<const Pack<T>*>(m)[k];
    Pack<T> vp = reinterpret_cast<const Pack<T>*>(v)[k];
#pragma unroll
    for (int j = 0; j < kIlp; ++j) {
      C pj = widen(pp.v[j]), mj = widen(mp.v[j]), vj = widen(vp.v[j]);
      C gj = widen(gp.v[j]);
      if (scaled) gj = mul_rn(gj, scale);
      adamw_update(pj, gj, mj, vj, s);
      pp.v[j] = narrow<T>(pj);
      mp.v[j] = narrow<T>(mj);
      vp.v[j] = narrow<T>(vj);
    }
    reinterpret_cast<Pack<T>*>(p)[k] = pp;
    reinterpret_cast<Pack<T>*>(m)[k] = mp;
    reinterpret_cast<Pack<T>*>(v)[k] = vp;
  }
  for (int64_t i = packs * kIlp + threadIdx.x; i < len; i += blockDim.x) {
    C pi = widen(p[i]), mi = widen(m[i]), vi = widen(v[i]);
    C gi = widen(g[i]);
    if (scaled) gi = mul_rn(gi, scale);
    adamw_update(pi, gi, mi, vi, s);
    p[i] = narrow<T>(pi);
    m[i] = narrow<T>(mi);
    v[i] = narrow<T>(vi);
  }
}

template <typename T>
void launch_adamw_table(const ChunkTable& table, int blocks, const AdamWScalars<Acc<T>>& s,
                        const float* grad_scale, const void* device_scalars,
                        cudaStream_t stream) {
  adamw_kernel<T><<<blocks, kAdamThreads, 0, stream>>>(
      table, s, grad_scale, static_cast<const AdamWScalars<Acc<T>>*>(device_scalars));
  LOOM_CUDA_CHECK_LAUNCH();
}

void check_adamw_tensor(const AdamWTensor& t, int index) {
  if (t.n < 0) fail("multi_tensor_adamw: tensor #", index, " has a negative size ", t.n);
  if (t.n > 0 && (t.param == nullptr || t.grad == nullptr || t.exp_avg == nullptr ||
                  t.exp_avg_sq == nullptr)) {
    fail("multi_tensor_adamw: tensor #", index, " (", t.n,
         " elements) has a null buffer; param, grad, exp_avg and exp_avg_sq are all needed");
  }
  if (ceil_div(t.n, kChunk) > INT32_MAX)
    fail("multi_tensor_adamw: tensor #", index, " has too many elements (", t.n, ")");
}

// ---------------------------------------------------------------------------------------------
// SGD.

template <typename C>
struct SGDScalars {
  C weight_decay, momentum, one_minus_dampening, neg_lr;
  bool decay, use_momentum, first_step, nesterov;
};

// The switches are uniform across the grid, so the branches cost nothing measurable in this
// bandwidth-bound loop; one kernel per dtype instead of 16 per dtype.
template <typename T>
__global__ void sgd_kernel(T* p, const T* g, T* buf, int64_t n, const SGDScalars<Acc<T>> s) {
  using C = Acc<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const C pi = widen(p[i]);
    C d = widen(g[i]);
    if (s.decay) d = add_rn(d, mul_rn(s.weight_decay, pi));  // d_p.add(param, alpha=wd)
    if (s.use_momentum) {
      // buf = clone(d_p), or buf.mul_(momentum).add_(d_p, alpha=1-dampening)
      const C b = s.first_step
                      ? d
                      : add_rn(mul_rn(widen(buf[i]), s.momentum), mul_rn(s.one_minus_dampening, d));
      buf[i] = narrow<T>(b);
      d = s.nesterov ? add_rn(d, mul_rn(s.momentum, b)) : b;  // d_p.add(buf, alpha=momentum)
    }
    p[i] = narrow<T>(add_rn(pi, mul_rn(s.neg_lr, d)));  // param.add_(d_p, alpha=-lr)
  }
}

}  // namespace

size_t adamw_scalars_bytes(DType dtype) {
  size_t bytes = 0;
  dispatch_arithmetic(dtype, "adamw_scalars_bytes",
                      [&]<typename T>() { bytes = sizeof(AdamWScalars<Acc<T>>); });
  return bytes;
}

void write_adamw_scalars(DType dtype, const AdamWArgs& args, void* host) {
  if (args.step < 1) fail("write_adamw_scalars: step must be >= 1 (1-based), got ", args.step);
  dispatch_arithmetic(dtype, "write_adamw_scalars", [&]<typename T>() {
    const AdamWScalars<Acc<T>> s = adamw_scalars<Acc<T>>(args);
    std::memcpy(host, &s, sizeof(s));
  });
}

void multi_tensor_adamw(DType dtype, const AdamWTensor* tensors, int count, const AdamWArgs& args,
                        const float* grad_scale, cudaStream_t stream,
                        const void* device_scalars) {
  if (count < 0) fail("multi_tensor_adamw: negative tensor count ", count);
  if (count > 0 && tensors == nullptr)
    fail("multi_tensor_adamw: tensors is null for ", count, " tensors");
  if (args.step < 1) fail("multi_tensor_adamw: step must be >= 1 (1-based), got ", args.step);
  for (int k = 0; k < count; ++k)
    check_adamw_tensor(tensors[k], k);
  dispatch_arithmetic(dtype, "multi_tensor_adamw", [&]<typename T>() {
    const AdamWScalars<Acc<T>> s = adamw_scalars<Acc<T>>(args);
    ChunkTable table;
    for_each_chunk_plan(
        table, count, kChunk, [&](int k) { return tensors[k].n; },
        [&](int slot, int k) {
          table.param[slot] = tensors[k].param;
          table.grad[slot] = tensors[k].grad;
          table.exp_avg[slot] = tensors[k].exp_avg;
          table.exp_avg_sq[slot] = tensors[k].exp_avg_sq;
          table.n[slot] = tensors[k].n;
        },
        [&](int blocks) {
          launch_adamw_table<T>(table, blocks, s, grad_scale, device_scalars, stream);
        });
  });
}

void sgd_step(DType dtype, void* param, const void* grad, void* momentum_buffer, int64_t n,
              const SGDArgs& args, cudaStream_t stream) {
  if (n < 0) fail("sgd_step: negative element count ", n);
  if (n == 0) return;
  if (param == nullptr || grad == nullptr)
    fail("sgd_step: param and grad must not be null (", n, " elements)");
  if (args.momentum != 0.0 && momentum_buffer == nullptr)
    fail("sgd_step: momentum ", args.momentum, " needs a momentum buffer, got nullptr");
  dispatch_arithmetic(dtype, "sgd_step", [&]<typename T>() {
    using C = Acc<T>;
    SGDScalars<C> s;
    s.weight_decay = static_cast<C>(args.weight_decay);
    s.momentum = static_cast<C>(args.momentum);
    s.one_minus_dampening = static_cast<C>(1.0 - args.dampening);
    s.neg_lr = static_cast<C>(-args.lr);
    s.decay = args.weight_decay != 0.0;
    s.use_momentum = args.momentum != 0.0;
    s.first_step = args.first_step;
    s.nesterov = args.nesterov;
    constexpr int kThreads = 256;
    sgd_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(momentum_buffer), n,
        s);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace loom::kernels::cuda
