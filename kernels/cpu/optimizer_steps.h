#pragma once
// Optimizer updates and gradient-norm reductions on raw, contiguous CPU buffers. Templates are
// instantiated for float and double.
//
// Note [Matching PyTorch's optimizer arithmetic]
// The updates follow PyTorch 1.13's single-tensor paths (foreach=False, fused=False) one
// tensor op at a time, in the same order, so that results agree with torch to rounding.
// Hyper-parameter arithmetic (1 - lr*wd, bias corrections, step size) happens in double, as in
// torch's Python code, and each resulting scalar is rounded to T once, as torch does when it
// passes a Python float to an op on a T tensor. Rounding can still differ in the last bit
// where torch's vectorised kernels use fused multiply-adds.

#include <cstdint>

namespace loom::kernels::cpu {

struct AdamWStepArgs {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  int64_t step = 1;  // 1-based count of updates of this parameter, including this one
};

// torch.optim.AdamW (amsgrad=False, maximize=False), elementwise over n values:
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   p += -(lr / (1-b1^step)) * m / (sqrt(v) / sqrt(1-b2^step) + eps)
// The four buffers must not overlap.
template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n,
                const AdamWStepArgs& args);

struct SGDStepArgs {
  double lr = 0.0;
  double momentum = 0.0;  // 0 disables the momentum buffer (it is then not touched)
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffer holds no history yet: it is set to d
};

// torch.optim.SGD (maximize=False), elementwise over n values:
//   d = g + wd*p                       (when wd != 0)
//   buf = first_step ? d : momentum*buf + (1-dampening)*d    (when momentum != 0)
//   d = nesterov ? d + momentum*buf : buf                    (when momentum != 0)
//   p += -lr * d
// momentum_buffer may be null when momentum == 0. The buffers must not overlap.
template <typename T>
void sgd_step(T* param, const T* grad, T* momentum_buffer, int64_t n, const SGDStepArgs& args);

// Reductions behind gradient clipping, accumulated in double.
template <typename T>
double sum_of_squares(const T* x, int64_t n);
template <typename T>
double sum_of_abs_powers(const T* x, int64_t n, double p);  // sum |x|^p
template <typename T>
double max_abs(const T* x, int64_t n);  // 0 for n == 0; NaN if any element is NaN

}  // namespace loom::kernels::cpu
