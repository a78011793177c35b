#pragma once
// Optimizer updates on the GPU: the CUDA counterparts of kernels/cpu/optimizer_steps.h.
//
// The arithmetic is the CPU's statement by statement (see Note [Matching PyTorch's optimizer
// arithmetic] in kernels/cpu/optimizer_steps.h): hyper-parameter scalars are computed in double
// on the host and rounded once to the compute type, and every device operation is an explicitly
// rounded add/mul/div/sqrt (no fused multiply-adds), so f32 and f64 results equal the CPU's
// bit for bit where the CPU build does not contract to FMA either. Loom's release build
// (-march=native) does contract, and there about 1 value in 6 differs from the CPU's by an ulp
// (seen under CPU emulation of these kernels). bf16 and f16 buffers are
// updated in f32 and rounded to nearest even on store. Dtypes: f32, f64, bf16, f16 (the same
// dtype for every buffer of a call). Launchers are asynchronous on `stream`.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace loom::kernels::cuda {

// One parameter's buffers, all on the device, contiguous, n elements each, not overlapping.
struct AdamWTensor {
  void* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  int64_t n;
};

// As kernels::cpu::AdamWStepArgs; `step` is the 1-based update count, shared by all tensors.
struct AdamWArgs {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  int64_t step = 1;
};

// torch.optim.AdamW (amsgrad=False, maximize=False) over `count` tensors in as few launches as
// possible: the tensors are cut into fixed chunks whose addresses travel in the kernel's
// parameters (several launches when there are more chunks or tensors than one launch holds).
// `tensors` is host memory, read during the call only. `grad_scale`, when not null, points to
// one float on the device by which every gradient element is multiplied first (e.g. 1/loss
// scale, or a clipping coefficient computed on the device): the CPU's update of g * scale.
// Tensors with n == 0 are skipped.
// `device_scalars`, when not null, is device memory that holds, when the launch runs, what
// write_adamw_scalars(dtype, a, ...) wrote for some AdamWArgs a: the kernel takes the
// learning rate, the decay and the bias corrections from there, not from `args` (which are
// still checked). A captured launch then replays with the scalars of each new step (Note
// [Capturable AdamW] in optim/adamw.h).
void multi_tensor_adamw(DType dtype, const AdamWTensor* tensors, int count, const AdamWArgs& args,
                        const float* grad_scale, cudaStream_t stream,
                        const void* device_scalars = nullptr);

// The scalars multi_tensor_adamw derives from `args` for `dtype`'s compute type, as it
// computes them (in double on the host, rounded once): adamw_scalars_bytes(dtype) bytes
// written to `host`.
size_t adamw_scalars_bytes(DType dtype);
void write_adamw_scalars(DType dtype, const AdamWArgs& args, void* host);

// As kernels::cpu::SGDStepArgs.
struct SGDArgs {
  double lr = 0.0;
  double momentum = 0.0;  // 0 disables the momentum buffer (it is then not touched)
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer holds no history yet: it is set to d
};

// torch.optim.SGD (maximize=False) over n elements, as kernels::cpu::sgd_step.
// momentum_buffer may be null when args.momentum == 0.
void sgd_step(DType dtype, void* param, const void* grad, void* momentum_buffer, int64_t n,
              const SGDArgs& args, cudaStream_t stream);

}  // namespace loom::kernels::cuda
