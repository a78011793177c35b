// Elementwise arithmetic with NumPy broadcasting, scalar forms, activations (GELU, SiLU) and
// in-place updates.

#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"
#include "tensor/ops/widening_add.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/elementwise.h"
#endif

namespace loom {

namespace {

using kernels::cpu::BinaryOp;

// Strides that read `t` as if expanded to `shape` (0 on broadcast dimensions).
Shape broadcast_strides(const Tensor& t, const Shape& shape) {
  Shape strides(shape.size(), 0);
  size_t lead = shape.size() - t.shape().size();
  for (size_t i = 0; i < t.shape().size(); ++i) {
    strides[lead + i] = t.shape()[i] == 1 ? 0 : t.strides()[i];
  }
  return strides;
}

Tensor binary_forward(BinaryOp op, const char* name, const Tensor& a, const Tensor& b) {
  detail::check_kernel_device(name, a);
  detail::check_kernel_device(name, b);
  detail::check_same_kind(name, a, b);
  if (detail::computes_through_f32(a)) {
    NoGradGuard no_grad;
    return cast(binary_forward(op, name, detail::widened(a), detail::widened(b)), a.dtype());
  }
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  if (reports_op_cost(out.device())) {
    record_meta_op(name, OpClass::Elementwise, double(out.numel()), {a, b}, {out});
  }
  if (out.device().is_meta()) return out;
  Shape sa = broadcast_strides(a, shape), sb = broadcast_strides(b, shape);
  if (a.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::binary(static_cast<kernels::cuda::BinaryOp>(op), a.dtype(),
                                       static_cast<int>(shape.size()), shape.data(), a.raw_data(),
                                       sa.data(), b.raw_data(), sb.data(), out.raw_data(),
                                       detail::stream_of(a)));
    return out;
  }
  detail::dispatch_floating(a.dtype(), name, [&]<typename T>() {
    kernels::cpu::binary<T>(op, static_cast<int>(shape.size()), shape.data(), a.data<T>(),
                            sa.data(), b.data<T>(), sb.data(), out.data<T>());
  });
  return out;
}

// A binary op's operands in one dtype: a floating operand narrower than the other is cast up
// (recorded by autograd, so its gradient returns in its own dtype), as PyTorch promotes a bf16
// matmul result added to an f32 residual.
std::pair<Tensor, Tensor> promoted(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.dtype() == b.dtype() || !is_floating(a.dtype()) ||
      !is_floating(b.dtype()))
    return {a, b};
  const DType common = detail::promoted_dtype(a.dtype(), b.dtype());
  return {a.dtype() == common ? a : cast(a, common), b.dtype() == common ? b : cast(b, common)};
}

// out = a + b for an f32 a and a bf16 or f16 b, both contiguous, b of out's shape and a of its
// shape or of its trailing dimensions (a bias, broadcast over the rows), in one pass with b
// widened on load (out may be a).
void add_widened_into(Tensor& out, const Tensor& a, const Tensor& b) {
  if (reports_op_cost(out.device())) {
    record_meta_op(out.is_same(a) ? "add_" : "add", OpClass::Elementwise, double(out.numel()),
                   {a, b}, {out});
  }
  if (out.device().is_meta() || out.numel() == 0) return;
  if (out.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::add_widened(b.dtype(), out.data<float>(), a.data<float>(),
                                            a.numel(), b.raw_data(), out.numel(),
                                            detail::stream_of(out)));
    return;
  }
  kernels::cpu::add_widened(out.data<float>(), a.data<float>(), a.numel(),
                            static_cast<const uint16_t*>(b.raw_data()), b.dtype(), out.numel());
}

// a (f32, contiguous) += b (bf16 or f16, a's shape) in one pass, b widened on load.
void add_widened_(Tensor& a, const Tensor& b) {
  if (b.shape() != a.shape() || b.device() != a.device()) {
    fail("add_: a ", dtype_name(b.dtype()), " addend of an f32 tensor must have its shape and "
         "device: ", a.str(), " += ", b.str());
  }
  NoGradGuard no_grad;
  add_widened_into(a, a, b.contiguous());
}

constexpr const char* kWideningAdd = "AddWidened";

// Note [An f32 tensor plus a 16-bit one]
// Under autocast a bf16 matmul result meets the f32 residual stream in an add, or an f32 bias
// (the tensor-parallel row-parallel layers add theirs after the reduction): promoted() would
// cast it to f32 (a pass of its own) and then add. Where both are contiguous and the f32
// operand has the other's shape or its trailing dimensions, the sum runs in one pass, widening
// on load: the same values (widening is exact and IEEE addition commutes), and backward gives
// the 16-bit operand its gradient cast to its dtype, as promoted()'s recorded cast would, and
// the f32 one its gradient summed to its shape. Undefined when a and b are not such a pair.
Tensor add_of_f32_and_16bit(const Tensor& a, const Tensor& b) {
  const bool a_wide = a.dtype() == DType::F32 && is_16bit_float(b.dtype());
  const bool b_wide = b.dtype() == DType::F32 && is_16bit_float(a.dtype());
  if ((!a_wide && !b_wide) || a.device() != b.device() || !a.is_contiguous() ||
      !b.is_contiguous())
    return Tensor();
  const Tensor& wide = a_wide ? a : b;
  const Tensor& narrow = a_wide ? b : a;
  const Shape& shape = narrow.shape();
  const size_t rank = wide.shape().size();
  if (rank == 0 || rank > shape.size() || !std::equal(wide.shape().begin(), wide.shape().end(),
                                                      shape.end() - static_cast<ptrdiff_t>(rank)))
    return Tensor();
  detail::check_kernel_device("add", a);
  Tensor out = Tensor::empty(shape, DType::F32, a.device());
  add_widened_into(out, wide, narrow);
  if (autograd::any_requires_grad({a, b})) {
    // Operands of one shape: a node a norm after it may take over (widening_add.h).
    const char* name = wide.shape() == shape ? kWideningAdd : "Add";
    autograd::record(name, {a, b}, {out},
                     [da = a.dtype(), db = b.dtype(), sa = a.shape(), sb = b.shape()](
                         const std::vector<Tensor>& g, const autograd::Node& node) {
                       auto in = [&](DType dtype, const Shape& s) {
                         return dtype == DType::F32 ? sum_to(g[0], s) : cast(g[0], dtype);
                       };
                       return std::vector<Tensor>{
                           node.needs_input_grad(0) ? in(da, sa) : Tensor(),
                           node.needs_input_grad(1) ? in(db, sb) : Tensor()};
                     });
  }
  return out;
}

}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  if (Tensor sum = add_of_f32_and_16bit(a_in, b_in); sum.defined()) return sum;
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_forward(BinaryOp::Add, "add", a, b);
  if (autograd::any_requires_grad({a, b})) {
    autograd::record(
        "Add", {a, b}, {out},
        [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g, const autograd::Node& node) {
          return std::vector<Tensor>{node.needs_input_grad(0) ? sum_to(g[0], sa) : Tensor(),
                                     node.needs_input_grad(1) ? sum_to(g[0], sb) : Tensor()};
        });
  }
  return out;
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_forward(BinaryOp::Sub, "sub", a, b);
  if (autograd::any_requires_grad({a, b})) {
    autograd::record(
        "Sub", {a, b}, {out},
        [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g, const autograd::Node& node) {
          return std::vector<Tensor>{node.needs_input_grad(0) ? sum_to(g[0], sa) : Tensor(),
                                     node.needs_input_grad(1) ? sum_to(neg(g[0]), sb) : Tensor()};
        });
  }
  return out;
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_forward(BinaryOp::Mul, "mul", a, b);
  if (autograd::any_requires_grad({a, b})) {
    autograd::record(
        "Mul", {a, b}, {out},
        [a = a.detach(), b = b.detach()](const std::vector<Tensor>& g, const autograd::Node& node) {
          return std::vector<Tensor>{
              node.needs_input_grad(0) ? sum_to(mul(g[0], b), a.shape()) : Tensor(),
              node.needs_input_grad(1) ? sum_to(mul(g[0], a), b.shape()) : Tensor()};
        });
  }
  return out;
}

Tensor div(const Tensor& a_in, const Tensor& b_in) {
  const auto [a, b] = promoted(a_in, b_in);
  Tensor out = binary_forward(BinaryOp::Div, "div", a, b);
  if (autograd::any_requires_grad({a, b})) {
    autograd::record(
        "Div", {a, b}, {out},
        [a = a.detach(), b = b.detach()](const std::vector<Tensor>& g, const autograd::Node& node) {
          Tensor ga, gb;
          if (node.needs_input_grad(0)) ga = sum_to(div(g[0], b), a.shape());
          if (node.needs_input_grad(1)) gb = sum_to(neg(div(mul(g[0], a), mul(b, b))), b.shape());
          return std::vector<Tensor>{ga, gb};
        });
  }
  return out;
}

namespace {

// a + value (op Add) or a * value (op Mul; no other op), never recorded.
Tensor scalar_forward(BinaryOp op, const Tensor& a, double value) {
  const char* name = op == BinaryOp::Add ? "add" : "mul";
  detail::check_kernel_device(name, a);
  if (detail::computes_through_f32(a)) {
    NoGradGuard no_grad;
    return cast(scalar_forward(op, detail::widened(a), value), a.dtype());
  }
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  Tensor src = detail::contiguous_input(a);
  if (reports_op_cost(a.device())) {
    record_meta_op(name, OpClass::Elementwise, double(a.numel()), {src}, {out});
  }
  if (a.device().is_meta()) return out;
  if (a.device().is_cuda()) {
    LOOM_IF_CUDA(op == BinaryOp::Add
                     ? kernels::cuda::add_scalar(a.dtype(), src.raw_data(), value, out.raw_data(),
                                                 a.numel(), detail::stream_of(a))
                     : kernels::cuda::scale(a.dtype(), src.raw_data(), value, out.raw_data(),
                                            a.numel(), detail::stream_of(a)));
    return out;
  }
  detail::dispatch_floating(a.dtype(), name, [&]<typename T>() {
    if (op == BinaryOp::Add)
      kernels::cpu::add_scalar<T>(src.data<T>(), static_cast<T>(value), out.data<T>(), a.numel());
    else
      kernels::cpu::scale<T>(src.data<T>(), static_cast<T>(value), out.data<T>(), a.numel());
  });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, double value) {
  Tensor out = scalar_forward(BinaryOp::Add, a, value);
  if (autograd::any_requires_grad({a})) {
    autograd::record("AddScalar", {a}, {out},
                     [](const std::vector<Tensor>& g, const autograd::Node&) { return g; });
  }
  return out;
}

Tensor mul(const Tensor& a, double factor) {
  Tensor out = scalar_forward(BinaryOp::Mul, a, factor);
  if (autograd::any_requires_grad({a})) {
    autograd::record("MulScalar", {a}, {out},
                     [factor](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{mul(g[0], factor)};
                     });
  }
  return out;
}

Tensor neg(const Tensor& a) {
  return mul(a, -1.0);
}

namespace {

// An activation y = f(x) with dx = dy * f'(x): the CUDA and CPU kernels of each direction.
struct ActivationKernels {
  const char* name;  // the op's and the autograd node's
  const char* node;
#if LOOM_WITH_CUDA
  void (*cuda_forward)(DType, const void*, void*, int64_t, cudaStream_t);
  void (*cuda_backward)(DType, const void*, const void*, void*, int64_t, cudaStream_t);
#endif
  void (*cpu_forward_f32)(const float*, float*, int64_t);
  void (*cpu_backward_f32)(const float*, const float*, float*, int64_t);
  void (*cpu_forward_f64)(const double*, double*, int64_t);
  void (*cpu_backward_f64)(const double*, const double*, double*, int64_t);

  template <typename T>
  auto cpu_forward() const {
    if constexpr (std::is_same_v<T, float>)
      return cpu_forward_f32;
    else
      return cpu_forward_f64;
  }
  template <typename T>
  auto cpu_backward() const {
    if constexpr (std::is_same_v<T, float>)
      return cpu_backward_f32;
    else
      return cpu_backward_f64;
  }
};

// FLOPs per element of an activation's forward as the meta device counts them (tanh-GELU:
// x^3, a fused multiply-add, tanh, a product; SiLU: exp, a division, a product); its backward
// counts twice that.
constexpr double kActivationFlops = 8;

// y = f(x) for a contiguous x, never recorded.
Tensor activation_forward(const Tensor& in, const ActivationKernels& k) {
  if (detail::computes_through_f32(in)) {
    NoGradGuard no_grad;
    return cast(activation_forward(detail::widened(in), k), in.dtype());
  }
  Tensor out = Tensor::empty(in.shape(), in.dtype(), in.device());
  if (reports_op_cost(in.device())) {
    record_meta_op(k.name, OpClass::Elementwise, kActivationFlops * double(in.numel()), {in},
                   {out});
  }
  if (in.device().is_meta()) return out;
  if (in.device().is_cuda()) {
    LOOM_IF_CUDA(k.cuda_forward(in.dtype(), in.raw_data(), out.raw_data(), in.numel(),
                                detail::stream_of(in)));
    return out;
  }
  detail::dispatch_floating(in.dtype(), k.name, [&]<typename T>() {
    k.cpu_forward<T>()(in.data<T>(), out.data<T>(), in.numel());
  });
  return out;
}

// dx = dy * f'(x) for a contiguous x, never recorded.
Tensor activation_backward(const Tensor& in, const Tensor& dy_in, const ActivationKernels& k) {
  if (detail::computes_through_f32(in)) {
    NoGradGuard no_grad;
    return cast(activation_backward(detail::widened(in), detail::widened(dy_in), k), in.dtype());
  }
  Tensor dy = detail::contiguous_input(dy_in);
  Tensor dx = Tensor::empty(in.shape(), in.dtype(), in.device());
  if (reports_op_cost(in.device())) {
    record_meta_op(k.node, OpClass::Elementwise, 2 * kActivationFlops * double(in.numel()),
                   {in, dy}, {dx});
  }
  if (in.device().is_meta()) return dx;
  if (in.device().is_cuda()) {
    LOOM_IF_CUDA(k.cuda_backward(in.dtype(), in.raw_data(), dy.raw_data(), dx.raw_data(),
                                 in.numel(), detail::stream_of(in)));
    return dx;
  }
  detail::dispatch_floating(in.dtype(), k.name, [&]<typename T>() {
    k.cpu_backward<T>()(in.data<T>(), dy.data<T>(), dx.data<T>(), in.numel());
  });
  return dx;
}

Tensor activation(const Tensor& x, const ActivationKernels& k) {
  detail::check_kernel_device(k.name, x);
  Tensor in = detail::contiguous_input(x);
  Tensor out = activation_forward(in, k);
  if (autograd::any_requires_grad({x})) {
    autograd::record(k.node, {x}, {out},
                     [in = in.detach(), k](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{activation_backward(in, g[0], k)};
                     });
  }
  return out;
}

#if LOOM_WITH_CUDA
#define LOOM_ACTIVATION(name, node, fn)                                         \
  ActivationKernels {                                                           \
    name, node, kernels::cuda::fn##_forward, kernels::cuda::fn##_backward,      \
        kernels::cpu::fn##_forward<float>, kernels::cpu::fn##_backward<float>,  \
        kernels::cpu::fn##_forward<double>, kernels::cpu::fn##_backward<double> \
  }
#else
#define LOOM_ACTIVATION(name, node, fn)                                                \
  ActivationKernels {                                                                  \
    name, node, kernels::cpu::fn##_forward<float>, kernels::cpu::fn##_backward<float>, \
        kernels::cpu::fn##_forward<double>, kernels::cpu::fn##_backward<double>        \
  }
#endif

}  // namespace

Tensor gelu(const Tensor& x) {
  return activation(x, LOOM_ACTIVATION("gelu", "Gelu", gelu));
}

Tensor detail::gelu_backward(const Tensor& x, const Tensor& dy) {
  return activation_backward(x, dy, LOOM_ACTIVATION("gelu", "Gelu", gelu));
}

Tensor silu(const Tensor& x) {
  return activation(x, LOOM_ACTIVATION("silu", "Silu", silu));
}

#undef LOOM_ACTIVATION

void add_(Tensor& a, const Tensor& b) {
  detail::check_kernel_device("add_", a);
  check(a.is_contiguous(), "add_: destination must be contiguous");
  if (a.dtype() == DType::F32 && is_16bit_float(b.dtype())) {
    add_widened_(a, b);
    return;
  }
  detail::check_same_kind("add_", a, b);
  NoGradGuard no_grad;
  Tensor src = b.shape() == a.shape() ? b.contiguous() : expand(b, a.shape()).contiguous();
  if (reports_op_cost(a.device())) {
    record_meta_op("add_", OpClass::Elementwise, double(a.numel()), {a, src}, {a});
  }
  if (a.device().is_meta()) return;
  if (detail::computes_through_f32(a)) {
    copy_(a, add(detail::widened(a), detail::widened(src)));
    return;
  }
  if (a.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::add_inplace(a.dtype(), a.raw_data(), src.raw_data(), a.numel(),
                                            detail::stream_of(a)));
    return;
  }
  detail::dispatch_floating(a.dtype(), "add_", [&]<typename T>() {
    kernels::cpu::add_inplace<T>(a.data<T>(), src.data<T>(), a.numel());
  });
}

void mul_(Tensor& a, double factor) {
  detail::check_kernel_device("mul_", a);
  check(a.is_contiguous(), "mul_: destination must be contiguous");
  if (reports_op_cost(a.device())) {
    record_meta_op("mul_", OpClass::Elementwise, double(a.numel()), {a}, {a});
  }
  if (a.device().is_meta()) return;
  if (detail::computes_through_f32(a)) {
    NoGradGuard no_grad;
    copy_(a, mul(detail::widened(a), factor));
    return;
  }
  if (a.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::scale_inplace(a.dtype(), a.raw_data(), factor, a.numel(),
                                              detail::stream_of(a)));
    return;
  }
  detail::dispatch_floating(a.dtype(), "mul_", [&]<typename T>() {
    kernels::cpu::scale_inplace<T>(a.data<T>(), static_cast<T>(factor), a.numel());
  });
}

std::optional<detail::WideningAdd> detail::widening_add_operands(const Tensor& sum) {
  if (!sum.defined() || sum.grad_fn() == nullptr || sum.grad_fn()->name() != kWideningAdd)
    return std::nullopt;
  std::vector<autograd::Edge>& edges = sum.grad_fn()->next_edges();
  if (edges.size() != 2 || !edges[0].node || !edges[1].node) return std::nullopt;
  const DType first = edges[0].node->outputs()[edges[0].input_nr].dtype;
  const bool first_is_stream = first == DType::F32;
  const autograd::Edge& branch = edges[first_is_stream ? 1 : 0];
  return WideningAdd{edges[first_is_stream ? 0 : 1], branch,
                     branch.node->outputs()[branch.input_nr].dtype};
}

}  // namespace loom
