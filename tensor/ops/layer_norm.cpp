// Layer normalisation over the last dimension.

#include "kernels/cpu/layer_norm.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"
#include "tensor/ops/dispatch.h"

namespace loom {

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  detail::check_kernel_device("layer_norm", x);
  detail::check_same_kind("layer_norm", x, weight);
  detail::check_same_kind("layer_norm", x, bias);
  if (x.dim() < 1 || weight.shape() != Shape{x.size(-1)} || bias.shape() != Shape{x.size(-1)}) {
    fail("layer_norm: expected weight and bias of shape [", x.dim() ? x.size(-1) : 0,
         "] for input ", shape_str(x.shape()), "; got ", shape_str(weight.shape()), " and ",
         shape_str(bias.shape()));
  }
  int64_t width = x.size(-1);
  int64_t rows = width ? x.numel() / width : 0;
  Tensor in = detail::contiguous_input(x), w = detail::contiguous_input(weight),
         b = detail::contiguous_input(bias);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mean = Tensor::empty({rows}, x.dtype(), x.device());
  Tensor rstd = Tensor::empty({rows}, x.dtype(), x.device());
  detail::dispatch_floating(x.dtype(), "layer_norm", [&]<typename T>() {
    kernels::cpu::layer_norm_forward<T>(in.data<T>(), w.data<T>(), b.data<T>(), out.data<T>(),
                                        mean.data<T>(), rstd.data<T>(), rows, width, eps);
  });
  if (autograd::any_requires_grad({x, weight, bias})) {
    autograd::record("LayerNorm", {x, weight, bias}, {out},
                     [in = in.detach(), w = w.detach(), mean, rstd, rows, width](
                         const std::vector<Tensor>& g, const autograd::Node& node) {
                       Tensor dy = g[0].contiguous();
                       Tensor dx = Tensor::empty(in.shape(), in.dtype(), in.device());
                       Tensor dw = Tensor::zeros(w.shape(), w.dtype(), w.device());
                       Tensor db = Tensor::zeros(w.shape(), w.dtype(), w.device());
                       detail::dispatch_floating(in.dtype(), "layer_norm", [&]<typename T>() {
                         kernels::cpu::layer_norm_backward<T>(
                             dy.data<T>(), in.data<T>(), w.data<T>(), mean.data<T>(),
                             rstd.data<T>(), dx.data<T>(), dw.data<T>(), db.data<T>(), rows, width);
                       });
                       return std::vector<Tensor>{node.needs_input_grad(0) ? dx : Tensor(),
                                                  node.needs_input_grad(1) ? dw : Tensor(),
                                                  node.needs_input_grad(2) ? db : Tensor()};
                     });
  }
  return out;
}

}  // namespace loom
