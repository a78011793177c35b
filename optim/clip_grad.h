#pragma once
// Gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ (PyTorch 1.13).

#include <limits>
#include <vector>

#include "tensor/tensor.h"

namespace loom::optim {

inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

// The norm of all gradients of `params` together, as if concatenated into one vector:
// the norm_type-norm of the vector of per-parameter norms (torch's formulation), accumulated in
// double; the 2-norm of an f32 gradient comes from its exact sum of squares (Note [Exact sums
// of squares] in kernels/cpu/exact_square_sum.h), so it does not depend on how it is split. norm_type is a positive number or kInfNorm (largest absolute value). Parameters
// without a gradient are skipped; with none at all the result is 0. Gradients must be
// contiguous f32 or f64 CPU tensors. NaN in any gradient gives NaN.
double grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

// Computes total = grad_norm(params, norm_type) and, when max_norm / (total + 1e-6) < 1,
// multiplies every gradient in place by that factor. Returns total (before clipping).
//
// Non-finite total (a gradient holds inf or NaN): the gradients are left untouched and the
// non-finite total is returned, or loom::Error is thrown when error_if_nonfinite. This departs
// from torch 1.13, which multiplies every gradient by the clamped factor (0 for an infinite
// total, NaN for a NaN total). The step that follows is invalid either way; leaving the
// gradients as they were keeps the information needed to find the overflowing parameter. The
// caller should check std::isfinite(returned norm) and skip the optimizer step.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

// clip_grad_norm for a step that a CUDA graph captures (tensor/cuda/graph.h): nothing is read
// back to the host and nothing is scaled. Every gradient of `params` must be a contiguous f32
// or bf16 tensor on one CUDA device; the norm is the 2-norm. Returns, on that device, the
// total norm (f64 []) and the factor (f32 []) by which clip_grad_norm would scale the
// gradients (1 where it would leave them, a non-finite norm included), both with
// clip_grad_norm's bits, in three launches. Give the factor to the optimizer
// (AdamW::set_grad_scale), which multiplies each gradient by it as it reads it. max_norm must
// be positive; infinity gives the norm alone.
struct DeviceClip {
  Tensor total_norm;
  Tensor factor;
};
DeviceClip clip_grad_norm_on_device(const std::vector<Tensor>& params, double max_norm);

// The pieces, for gradients spread over ranks (sharded strategies): the norm of a list of
// per-parameter norms in order (what grad_norm computes from its per-parameter norms), and
// clip_grad_norm's scaling given the total it would have computed.
double total_norm(const std::vector<double>& per_parameter_norms, double norm_type = 2.0);
// For CUDA gradients, whose 2-norms come from sums of squares in double rounded once to float
// (kernels/cuda/reduce.h): each of `grads`' (contiguous f32 or bf16 tensors on one device)
// sum of squares in double, unrounded (one copy to the host for all); and the 2-norm
// grad_norm gives a gradient whose double sum is `sum`. A gradient split into pieces gets
// grad_norm's norm from the sum of its pieces' sums, unless the pieces' double sums, added in
// another order than the whole's, straddle a float's rounding boundary (their difference is
// about 1e-16 of the sum; a float's spacing 1e-7).
std::vector<double> cuda_sums_of_squares(const std::vector<Tensor>& grads);
double cuda_two_norm(double sum);
double clip_grads_to_norm(const std::vector<Tensor>& params, double max_norm, double total,
                          double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace loom::optim
