// rotary_embedding: Llama's rotary positions in one pass each way.
//
// Note [Rotary positions in one pass]
// Hugging Face's apply_rotary_pos_emb, as ops, is x * cos + cat(-x2, x1) * sin with cos and
// sin cast to x's dtype: a negation, a concatenation, two products and a sum forward, and
// backward the products' gradients, the concatenation's and negation's, two scatters of the
// halves into zeros and the sums of x's three gradients: about a dozen passes over q and k
// each way (on CUDA 2026-12-06's count put Llama's rotary, SwiGLU and head repeats at half of
// a layer's 97 launches), plus the tables' casts. This op reads x (a view of the projection's
// heads, as it lies) and the tables (converted to x's dtype as they are read) once and writes
// y once, in x's layout; its backward reads dy and writes dx once, in that layout too, so
// the projection's backward reads dx as it lies instead of a copy.
// Numerics: the forward rounds as the ops do (each product, then their sum, to x's dtype: the
// bits of the composed ops, tested); the backward sums dy cos and the rotated dy sin in f32
// (f64 for f64) and rounds once, where the ops round each of the three gradients and their
// sums, so its bits are within a rounding or two of theirs in 16 bits and equal in f32 up to
// the order of one sum.

#include "kernels/cpu/rotary.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/rotary.h"
#endif

namespace loom {

namespace {

// FLOPs per element as the meta device counts them: two products and a sum.
constexpr double kRotaryFlops = 3;

// Calls f.template operator()<S, C>() with x's CPU storage type S and the tables' C (S or
// float).
template <typename F>
void dispatch_rotary(DType dtype, DType table_dtype, F&& f) {
  detail::dispatch_floating_storage(dtype, "rotary_embedding", [&]<typename S>() {
    if (table_dtype == dtype)
      f.template operator()<S, S>();
    else
      f.template operator()<S, float>();
  });
}

// An uninitialised tensor of `shape` with dense `strides` (a permutation of a contiguous
// layout).
Tensor empty_with_strides(const Shape& shape, const Shape& strides, DType dtype, Device device) {
  const Tensor span = Tensor::empty({numel_of(shape)}, dtype, device);
  return Tensor::make_view(span, shape, strides, 0);
}

// A tensor's strides (b, h, t) for the kernels, which want the last dim's stride to be 1.
#if LOOM_WITH_CUDA
kernels::cuda::RotaryLayout layout_of(const Tensor& t) {
  return {t.strides()[0], t.strides()[1], t.strides()[2]};
}
#endif

// dx, with the forward's output strides (x's layout where that was dense).
Tensor rotary_backward(const Tensor& dy_in, const Tensor& cos, const Tensor& sin,
                       const Shape& strides) {
  const Tensor dy = dy_in.strides()[3] == 1 ? dy_in : detail::contiguous_input(dy_in);
  Tensor dx = empty_with_strides(dy.shape(), strides, dy.dtype(), dy.device());
  const int64_t batch = dy.size(0), heads = dy.size(1), time = dy.size(2), dim = dy.size(3);
  if (reports_op_cost(dy.device()))
    record_meta_op("Rotary", OpClass::Elementwise, kRotaryFlops * double(dy.numel()),
                   {dy, cos, sin}, {dx});
  if (dy.device().is_meta() || dx.numel() == 0) return dx;
  if (dy.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::rotary_backward(
        dy.dtype(), cos.dtype(), dy.raw_data(), layout_of(dy), batch, heads, time, dim,
        cos.raw_data(), sin.raw_data(), dx.raw_data(), layout_of(dx), detail::stream_of(dy)));
    return dx;
  }
  const Shape& g = dy.strides();
  const Shape& o = dx.strides();
  dispatch_rotary(dy.dtype(), cos.dtype(), [&]<typename S, typename C>() {
    kernels::cpu::rotary_backward<S, C>(dy.data<S>(), batch, heads, time, dim, g[0], g[1], g[2],
                                        cos.data<C>(), sin.data<C>(), dx.data<S>(), o[0], o[1],
                                        o[2]);
  });
  return dx;
}

}  // namespace

Tensor rotary_embedding(const Tensor& x_in, const Tensor& cos_in, const Tensor& sin_in) {
  for (const Tensor* t : {&x_in, &cos_in, &sin_in})
    detail::check_kernel_device("rotary_embedding", *t);
  if (x_in.dim() != 4 || x_in.size(3) % 2 != 0 ||
      cos_in.shape() != Shape{x_in.size(2), x_in.size(3)} || sin_in.shape() != cos_in.shape()) {
    fail(
        "rotary_embedding: expected x [batch, heads, time, dim] with an even dim and cos, sin "
        "[time, dim]; got x ",
        shape_str(x_in.shape()), ", cos ", shape_str(cos_in.shape()), ", sin ",
        shape_str(sin_in.shape()));
  }
  if (!is_floating(x_in.dtype()) || cos_in.dtype() != sin_in.dtype() ||
      (cos_in.dtype() != x_in.dtype() && cos_in.dtype() != DType::F32)) {
    fail("rotary_embedding: expected a floating x and cos, sin both f32 or x's dtype; got x ",
         x_in.dtype(), ", cos ", cos_in.dtype(), ", sin ", sin_in.dtype());
  }
  if (cos_in.device() != x_in.device() || sin_in.device() != x_in.device()) {
    fail("rotary_embedding: x (", x_in.device(), ") and its tables (", cos_in.device(), ", ",
         sin_in.device(), ") must be on one device");
  }
  if (autograd::any_requires_grad({cos_in, sin_in}))
    fail("rotary_embedding: the position tables are constants; detach them");
  const Tensor x =
      x_in.strides()[3] == 1 || x_in.size(3) == 1 ? x_in : detail::contiguous_input(x_in);
  const Tensor cos = detail::contiguous_input(cos_in), sin = detail::contiguous_input(sin_in);
  const int64_t batch = x.size(0), heads = x.size(1), time = x.size(2), dim = x.size(3);
  // y keeps x's layout where it is dense (Llama's q and k: the projection's), else contiguous.
  Tensor y = detail::is_dense(x) ? empty_with_strides(x.shape(), x.strides(), x.dtype(), x.device())
                                 : Tensor::empty(x.shape(), x.dtype(), x.device());
  if (reports_op_cost(x.device()))
    record_meta_op("rotary", OpClass::Elementwise, kRotaryFlops * double(x.numel()), {x, cos, sin},
                   {y});
  if (x.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::rotary_forward(
        x.dtype(), cos.dtype(), x.raw_data(), layout_of(x), batch, heads, time, dim, cos.raw_data(),
        sin.raw_data(), y.raw_data(), layout_of(y), detail::stream_of(x)));
  } else if (!x.device().is_meta() && y.numel() > 0) {
    const Shape& in = x.strides();
    const Shape& out = y.strides();
    dispatch_rotary(x.dtype(), cos.dtype(), [&]<typename S, typename C>() {
      kernels::cpu::rotary_forward<S, C>(x.data<S>(), batch, heads, time, dim, in[0], in[1], in[2],
                                         cos.data<C>(), sin.data<C>(), y.data<S>(), out[0], out[1],
                                         out[2]);
    });
  }
  if (autograd::any_requires_grad({x_in})) {
    // The gradient is laid out as y: for Llama's q and k, the projection's layout, so the
    // products' backward reads it without a copy.
    autograd::record("Rotary", {x_in}, {y},
                     [cos = cos.detach(), sin = sin.detach(), strides = y.strides()](
                         const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{rotary_backward(g[0], cos, sin, strides)};
                     });
  }
  return y;
}

}  // namespace loom
