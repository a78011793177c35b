// swiglu: Llama's MLP activation, silu(gate) * up, in one pass each way.
//
// As ops, silu(gate) * up writes silu(gate) and reads it back for the product, keeps it for
// the product's backward (an [tokens, intermediate] tensor per layer), and its backward writes
// dy * up and dy * silu(gate) and then reads the first again for silu's backward: three
// launches on CUDA and a saved tensor more than this op, which reads gate and up and writes y
// forward, and reads gate, up and dy and writes both gradients backward.

#include "kernels/cpu/elementwise.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/elementwise.h"
#endif

namespace loom {

namespace {

// FLOPs per element as the meta device counts them: silu's 8 (elementwise.cpp's
// kActivationFlops) and the product; backward twice that.
constexpr double kSwigluFlops = 9;

std::vector<Tensor> swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy_in) {
  const Tensor dy = detail::contiguous_input(dy_in);
  Tensor dgate = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  Tensor dup = Tensor::empty(up.shape(), up.dtype(), up.device());
  if (reports_op_cost(gate.device()))
    record_meta_op("Swiglu", OpClass::Elementwise, 2 * kSwigluFlops * double(gate.numel()),
                   {gate, up, dy}, {dgate, dup});
  if (gate.device().is_meta()) return {dgate, dup};
  if (gate.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::swiglu_backward(gate.dtype(), gate.raw_data(), up.raw_data(),
                                                dy.raw_data(), dgate.raw_data(), dup.raw_data(),
                                                gate.numel(), detail::stream_of(gate)));
    return {dgate, dup};
  }
  detail::dispatch_floating_storage(gate.dtype(), "swiglu", [&]<typename S>() {
    kernels::cpu::swiglu_backward<S>(gate.data<S>(), up.data<S>(), dy.data<S>(), dgate.data<S>(),
                                     dup.data<S>(), gate.numel());
  });
  return {dgate, dup};
}

}  // namespace

Tensor swiglu(const Tensor& gate_in, const Tensor& up_in) {
  detail::check_kernel_device("swiglu", gate_in);
  detail::check_kernel_device("swiglu", up_in);
  detail::check_same_kind("swiglu", gate_in, up_in);
  if (gate_in.shape() != up_in.shape() || !is_floating(gate_in.dtype())) {
    fail("swiglu: expected floating gate and up of one shape; got gate ",
         shape_str(gate_in.shape()), " ", gate_in.dtype(), ", up ", shape_str(up_in.shape()), " ",
         up_in.dtype());
  }
  const Tensor gate = detail::contiguous_input(gate_in), up = detail::contiguous_input(up_in);
  Tensor y = Tensor::empty(gate.shape(), gate.dtype(), gate.device());
  if (reports_op_cost(gate.device()))
    record_meta_op("swiglu", OpClass::Elementwise, kSwigluFlops * double(gate.numel()),
                   {gate, up}, {y});
  if (gate.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::swiglu_forward(gate.dtype(), gate.raw_data(), up.raw_data(),
                                               y.raw_data(), gate.numel(),
                                               detail::stream_of(gate)));
  } else if (!gate.device().is_meta()) {
    detail::dispatch_floating_storage(gate.dtype(), "swiglu", [&]<typename S>() {
      kernels::cpu::swiglu_forward<S>(gate.data<S>(), up.data<S>(), y.data<S>(), gate.numel());
    });
  }
  if (autograd::any_requires_grad({gate_in, up_in})) {
    autograd::record("Swiglu", {gate_in, up_in}, {y},
                     [gate = gate.detach(), up = up.detach()](const std::vector<Tensor>& g,
                                                              const autograd::Node&) {
                       return swiglu_backward(gate, up, g[0]);
                     });
  }
  return y;
}

}  // namespace loom
