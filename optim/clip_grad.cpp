#include "optim/clip_grad.h"

#include <cmath>
#include <type_traits>

#include "core/tags.h"
#include "kernels/cpu/exact_square_sum.h"
#include "kernels/cpu/optimizer_steps.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/reduce.h"
#include "tensor/ops/cuda_support.h"
#endif

namespace loom::optim {

namespace {

// `norm_type`-norm of one gradient (a contiguous f32/f64 CPU tensor).
// f32 2-norms come from the exact sum of squares (Note [Exact sums of squares]), so that a
// gradient split across ranks (sharded strategies) has bitwise the same norm.
template <typename T>
double norm_of(const T* x, int64_t n, double norm_type) {
  if (norm_type == kInfNorm) return kernels::cpu::max_abs(x, n);
  if constexpr (std::is_same_v<T, float>) {
    if (norm_type == 2.0) {
      kernels::cpu::ExactSquareSum sum;
      sum.add_squares(x, n);
      return std::sqrt(sum.value());
    }
  }
  if (norm_type == 2.0) return std::sqrt(kernels::cpu::sum_of_squares(x, n));
  if (norm_type == 1.0) return kernels::cpu::sum_of_abs_powers(x, n, 1.0);
  return std::pow(kernels::cpu::sum_of_abs_powers(x, n, norm_type), 1.0 / norm_type);
}

void check_grad(const Tensor& grad, size_t index) {
  bool supported_dtype = !grad.device().is_cuda()
                             ? grad.dtype() == DType::F32 || grad.dtype() == DType::F64
                             : grad.dtype() == DType::F32 || grad.dtype() == DType::BF16;
  if (!supported_dtype || !grad.is_contiguous()) {
    tag::kOptim.fail("clip_grad_norm: gradient of parameter ", index, " is ", grad.str(),
                     "; supported: contiguous f32 or f64 tensors on the CPU, f32 or bf16 on CUDA");
  }
}

// The sum of squares of every gradient on one GPU ([grads] on it, in `dtype`: f32, rounded,
// or f64): each run of gradients of one dtype in a few launches (kernels/cuda/reduce.h's
// multi_tensor_sum_of_squares).
// On meta following CUDA's path (a simulated GPU rank) the two launches' costs are reported and
// the sums read as zeros, as meta tensors do.
Tensor sums_of_squares_on(const std::vector<Tensor>& grads, Device device, DType dtype) {
  Tensor squares = Tensor::empty({static_cast<int64_t>(grads.size())}, dtype, device);
  if (device.is_meta()) {
    if (reports_op_cost(device)) {
      double elements = 0;
      for (const Tensor& g : grads)
        elements += double(g.numel());
      record_meta_op("multi_tensor_sum_of_squares", OpClass::Reduction, 2 * elements, grads,
                     std::vector<Tensor>{});
      record_meta_op("finish_sums_of_squares", OpClass::Reduction, double(grads.size()),
                     std::vector<Tensor>{}, std::vector<Tensor>{squares});
    }
    return squares;
  }
#if LOOM_WITH_CUDA
  std::vector<kernels::cuda::TensorSpan> spans;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    if (g.device() != device) {
      tag::kOptim.fail("grad_norm: gradients on ", device, " and ", g.device(),
                       "; CUDA gradients must all be on one device");
    }
    spans.push_back({g.raw_data(), g.numel()});
    const bool run_ends = i + 1 == grads.size() || grads[i + 1].dtype() != g.dtype();
    if (!run_ends) continue;
    const int count = static_cast<int>(spans.size());
    Tensor scratch = detail::workspace(
        device, kernels::cuda::multi_tensor_squares_workspace_bytes(spans.data(), count));
    const size_t first = i + 1 - spans.size();
    if (dtype == DType::F32) {
      kernels::cuda::multi_tensor_sum_of_squares(g.dtype(), spans.data(), count,
                                                 squares.data<float>() + first, scratch.raw_data(),
                                                 detail::stream_of(g));
    } else {
      kernels::cuda::multi_tensor_sum_of_squares(g.dtype(), spans.data(), count,
                                                 squares.data<double>() + first, scratch.raw_data(),
                                                 detail::stream_of(g));
    }
    spans.clear();
  }
#endif
  return squares;
}

// The 2-norm of every gradient on one GPU: their sums of squares, one device-to-host copy for
// all of them, each rounded as cuda_two_norm rounds it.
std::vector<double> cuda_two_norms(const std::vector<Tensor>& grads) {
  std::vector<double> norms;
  for (double sum : cuda_sums_of_squares(grads))
    norms.push_back(cuda_two_norm(sum));
  return norms;
}

// grad *= factor for every gradient: CUDA gradients of one device and dtype in a few launches
// (kernels/cuda/elementwise.h's multi_tensor_scale), each as mul_ computes it.
void scale_grads(const std::vector<Tensor>& params, double factor) {
  std::vector<Tensor> cuda_grads;
  for (const Tensor& p : params) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (grad.device().is_cuda() && grad.is_contiguous() &&
        (cuda_grads.empty() ||
         (grad.device() == cuda_grads[0].device() && grad.dtype() == cuda_grads[0].dtype()))) {
      cuda_grads.push_back(grad);
    } else {
      mul_(grad, factor);
    }
  }
  if (cuda_grads.empty()) return;
#if LOOM_WITH_CUDA
  std::vector<void*> data;
  std::vector<int64_t> sizes;
  for (const Tensor& g : cuda_grads) {
    data.push_back(g.raw_data());
    sizes.push_back(g.numel());
  }
  kernels::cuda::multi_tensor_scale(cuda_grads[0].dtype(), data.data(), sizes.data(),
                                    static_cast<int>(data.size()), factor,
                                    detail::stream_of(cuda_grads[0]));
#endif
}

}  // namespace

double grad_norm(const std::vector<Tensor>& params, double norm_type) {
  if (!(norm_type > 0.0)) {
    tag::kOptim.fail("grad_norm: norm_type ", norm_type, " is not supported; expected > 0 or inf");
  }
  // Per-parameter norms, then the norm of those (torch stacks them and takes the norm again).
  // CUDA gradients: 2-norms on the device (one copy back for all), other norms on the CPU.
  std::vector<double> norms;
  std::vector<Tensor> cuda_grads;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor grad = params[i].grad();
    if (!grad.defined()) continue;
    check_grad(grad, i);
    if (takes_cuda_path(grad.device()) && norm_type == 2.0) {  // CUDA, or meta following it
      cuda_grads.push_back(grad);
      continue;
    }
    if (reports_op_cost(grad.device())) {
      record_meta_op("grad_norm", OpClass::Reduction, 2 * double(grad.numel()), {grad}, {});
    }
    if (grad.device().is_meta()) {  // a meta gradient's norm reads as 0 (tensor/meta.h)
      norms.push_back(0.0);
      continue;
    }
    Tensor host = grad.device().is_cuda() ? grad.to(Device::cpu()).to(DType::F32) : grad;
    norms.push_back(host.dtype() == DType::F32
                        ? norm_of(host.data<float>(), host.numel(), norm_type)
                        : norm_of(host.data<double>(), host.numel(), norm_type));
  }
  for (double norm : cuda_two_norms(cuda_grads))
    norms.push_back(norm);
  return total_norm(norms, norm_type);
}

double total_norm(const std::vector<double>& norms, double norm_type) {
  double total = 0.0;
  for (double norm : norms) {
    if (norm_type == kInfNorm) {
      total = (norm > total || std::isnan(norm)) ? norm : total;  // NaN propagates
    } else if (norm_type == 2.0) {
      total += norm * norm;
    } else {
      total += std::pow(norm, norm_type);
    }
  }
  if (norm_type == kInfNorm || norm_type == 1.0) return total;
  if (norm_type == 2.0) return std::sqrt(total);
  return std::pow(total, 1.0 / norm_type);
}

std::vector<double> cuda_sums_of_squares(const std::vector<Tensor>& grads) {
  if (grads.empty()) return {};
  for (size_t i = 0; i < grads.size(); ++i) {
    check_grad(grads[i], i);
    if (!takes_cuda_path(grads[i].device()))
      tag::kOptim.fail("cuda_sums_of_squares: gradient ", i, " is on ", grads[i].device());
  }
  return sums_of_squares_on(grads, grads[0].device(), DType::F64).to_vector<double>();
}

double cuda_two_norm(double sum) {
  // Rounded to float once, as multi_tensor_sum_of_squares' float sums are (the clipping kernel
  // reads those: clip_grad_norm_on_device).
  return std::sqrt(static_cast<double>(static_cast<float>(sum)));
}

DeviceClip clip_grad_norm_on_device(const std::vector<Tensor>& params, double max_norm) {
  if (!(max_norm > 0.0)) {
    tag::kOptim.fail("clip_grad_norm_on_device: max_norm must be positive (infinity: no "
                     "clipping), got ", max_norm);
  }
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor grad = params[i].grad();
    if (!grad.defined()) continue;
    check_grad(grad, i);
    if (!grad.device().is_cuda() || (!grads.empty() && grad.device() != grads[0].device())) {
      tag::kOptim.fail("clip_grad_norm_on_device: gradient of parameter ", i, " is ", grad.str(),
                       "; every gradient must be on one CUDA device");
    }
    grads.push_back(grad);
  }
  if (grads.empty()) tag::kOptim.fail("clip_grad_norm_on_device: no parameter has a gradient");
  const Device device = grads[0].device();
  DeviceClip out{Tensor::empty({}, DType::F64, device), Tensor::empty({}, DType::F32, device)};
#if LOOM_WITH_CUDA
  const Tensor squares = sums_of_squares_on(grads, device, DType::F32);
  kernels::cuda::clip_coefficient(squares.data<float>(), static_cast<int>(grads.size()), max_norm,
                                  out.total_norm.data<double>(), out.factor.data<float>(),
                                  detail::stream_of(squares));
#endif
  return out;
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  return clip_grads_to_norm(params, max_norm, grad_norm(params, norm_type), norm_type,
                            error_if_nonfinite);
}

double clip_grads_to_norm(const std::vector<Tensor>& params, double max_norm, double total,
                          double norm_type, bool error_if_nonfinite) {
  if (!std::isfinite(total)) {
    if (error_if_nonfinite) {
      tag::kOptim.fail("clip_grad_norm: the total norm of order ", norm_type,
                       " of the gradients is non-finite (", total, "), so they cannot be clipped");
    }
    return total;
  }
  const double clip_coef = max_norm / (total + 1e-6);
  if (clip_coef < 1.0) scale_grads(params, clip_coef);
  return total;
}

}  // namespace loom::optim
