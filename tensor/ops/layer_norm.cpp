// Layer and RMS normalisation over the last dimension.

#include <type_traits>

#include "kernels/cpu/layer_norm.h"
#include "tensor/autocast.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"
#include "tensor/ops/widening_add.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/layer_norm.h"
#endif

namespace loom {

namespace {
// FLOPs per element of a normalisation as the meta device counts them (a row's mean and
// variance, the normalised value, scale and shift); backward counts twice that. These ops are
// bandwidth-bound: the time model goes by their bytes.
constexpr double kNormFlops = 8;

// Throws unless weight and bias share x's dtype and device and have the size of its last
// dimension (layer_norm's and add_layer_norm's parameters).
void check_norm_parameters(const char* op, const Tensor& x, const Tensor& weight,
                           const Tensor& bias) {
  detail::check_same_kind(op, x, weight);
  detail::check_same_kind(op, x, bias);
  if (x.dim() < 1 || weight.shape() != Shape{x.size(-1)} || bias.shape() != Shape{x.size(-1)}) {
    fail(op, ": expected weight and bias of shape [", x.dim() ? x.size(-1) : 0, "] for input ",
         shape_str(x.shape()), "; got ", shape_str(weight.shape()), " and ",
         shape_str(bias.shape()));
  }
}

// Throws unless weight shares x's dtype and device and has the size of its last dimension
// (rms_norm's and add_rms_norm's parameter).
void check_rms_weight(const char* op, const Tensor& x, const Tensor& weight) {
  detail::check_same_kind(op, x, weight);
  if (x.dim() < 1 || weight.shape() != Shape{x.size(-1)}) {
    fail(op, ": expected weight of shape [", x.dim() ? x.size(-1) : 0, "] for input ",
         shape_str(x.shape()), "; got ", shape_str(weight.shape()));
  }
}

// The dtype of a norm's output: x's, or `out_dtype`, which must be x's or, for an f32 x, bf16
// or f16.
DType norm_output_dtype(const char* op, const Tensor& x, std::optional<DType> out_dtype) {
  const DType y = out_dtype.value_or(x.dtype());
  if (y != x.dtype() && (x.dtype() != DType::F32 || !is_16bit_float(y))) {
    fail(op, ": out_dtype ", y, " for an input of ", x.dtype(), "; expected the input's dtype ",
         "or, for an f32 input (after autocast's casts), bf16 or f16");
  }
  return y;
}

// Calls f.template operator()<T, L>() with the CPU storage types of a norm's input (T: float or
// double) and of its output in forward or its output's gradient in backward (L: T, or BFloat16
// or Half for a float T), as the kernels in kernels/cpu/layer_norm.h take them.
template <typename F>
void dispatch_norm_storage(DType dtype, DType low, const char* op, F&& f) {
  detail::dispatch_floating(dtype, op, [&]<typename T>() {
    if (low == dtype) return f.template operator()<T, T>();
    if constexpr (std::is_same_v<T, float>) {
      if (low == DType::BF16) return f.template operator()<float, BFloat16>();
      if (low == DType::F16) return f.template operator()<float, Half>();
    }
    fail(op, ": a gradient of ", low, " for an input of ", dtype, "; expected the input's dtype ",
         "or, for an f32 input, bf16 or f16");
  });
}

// What a norm's forward gives: its output and its rows' statistics (mean undefined for RMS).
struct NormForward {
  Tensor out, mean, rstd;
};

// The layer norm (centered) or RMS norm of contiguous `in` by w (and b), unrecorded: the
// output in y_dtype, the statistics in in's dtype on the CPU and f32 on CUDA (whose kernels
// read and write f32 statistics for every storage dtype). `op` names its cost on meta.
NormForward norm_forward(const char* op, bool centered, const Tensor& in, const Tensor& w,
                         const Tensor& b, double eps, DType y_dtype) {
  const Device device = in.device();
  const int64_t width = in.size(-1);
  const int64_t rows = width ? in.numel() / width : 0;
  const DType stats_dtype = device.is_cuda() ? DType::F32 : in.dtype();
  NormForward f{Tensor::empty(in.shape(), y_dtype, device),
                centered ? Tensor::empty({rows}, stats_dtype, device) : Tensor(),
                Tensor::empty({rows}, stats_dtype, device)};
  if (reports_op_cost(device)) {
    if (centered) {
      record_meta_op(op, OpClass::Normalization, kNormFlops * double(in.numel()), {in, w, b},
                     {f.out, f.mean, f.rstd});
    } else {
      record_meta_op(op, OpClass::Normalization, kNormFlops / 2 * double(in.numel()), {in, w},
                     {f.out, f.rstd});
    }
  }
  if (device.is_meta()) return f;  // nothing to compute: the cost is reported above
  if (device.is_cuda()) {
    LOOM_IF_CUDA({
      if (centered) {
        kernels::cuda::layer_norm_forward(in.dtype(), y_dtype, in.raw_data(), w.raw_data(),
                                          b.raw_data(), f.out.raw_data(), f.mean.data<float>(),
                                          f.rstd.data<float>(), rows, width, eps,
                                          detail::stream_of(in));
      } else {
        kernels::cuda::rms_norm_forward(in.dtype(), y_dtype, in.raw_data(), w.raw_data(),
                                        f.out.raw_data(), f.rstd.data<float>(), rows, width, eps,
                                        detail::stream_of(in));
      }
    });
    return f;
  }
  dispatch_norm_storage(in.dtype(), y_dtype, op, [&]<typename T, typename L>() {
    if (centered) {
      kernels::cpu::layer_norm_forward(in.data<T>(), w.data<T>(), b.data<T>(), f.out.data<L>(),
                                       f.mean.data<T>(), f.rstd.data<T>(), rows, width, eps);
    } else {
      kernels::cpu::rms_norm_forward(in.data<T>(), w.data<T>(), f.out.data<L>(),
                                     f.rstd.data<T>(), rows, width, eps);
    }
  });
  return f;
}

// Whether one kernel normalises x (and adds a residual of its shape) in each direction: x,
// the parameters (and the sum) of one dtype (f32 or f64 on the CPU, a CUDA storage dtype on
// CUDA), the output of it or, for an f32 x, of autocast's 16-bit `low`.
bool in_one_pass(bool centered, const Tensor& x, const Tensor& weight, const Tensor& bias,
                 DType low) {
  const DType t = x.dtype();
  const bool kernel_dtype = takes_cuda_path(x.device())
                                ? t == DType::F32 || is_16bit_float(t)
                                : t == DType::F32 || t == DType::F64;
  return kernel_dtype && weight.dtype() == t && (!centered || bias.dtype() == t) &&
         (low == t || (t == DType::F32 && is_16bit_float(low)));
}

}  // namespace

Tensor layer_norm(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, double eps,
                  std::optional<DType> out_dtype) {
  // Autocast's f32 list: every floating operand (16-bit weights included) in f32.
  const Tensor x = autocast_f32_input(x_in), weight = autocast_f32_input(weight_in),
               bias = autocast_f32_input(bias_in);
  detail::check_kernel_device("layer_norm", x);
  check_norm_parameters("layer_norm", x, weight, bias);
  const DType y_dtype = norm_output_dtype("layer_norm", x, out_dtype);
  if (detail::computes_through_f32(x)) {  // 16-bit weights on the CPU: f32, rounded once
    return cast(layer_norm(cast(x, DType::F32), cast(weight, DType::F32), cast(bias, DType::F32),
                           eps),
                y_dtype);
  }
  int64_t width = x.size(-1);
  int64_t rows = width ? x.numel() / width : 0;
  Tensor in = detail::contiguous_input(x), w = detail::contiguous_input(weight),
         b = detail::contiguous_input(bias);
  const NormForward f = norm_forward("layer_norm", true, in, w, b, eps, y_dtype);
  const Tensor out = f.out, mean = f.mean, rstd = f.rstd;
  if (autograd::any_requires_grad({x, weight, bias})) {
    autograd::record(
        "LayerNorm", {x, weight, bias}, {out},
        [in = in.detach(), w = w.detach(), mean, rstd, rows, width](const std::vector<Tensor>& g,
                                                                    const autograd::Node& node) {
          Tensor dy = g[0].contiguous();
          Tensor dx = Tensor::empty(in.shape(), in.dtype(), in.device());
          Tensor dw, db;
          if (in.device().is_cuda()) {  // the CUDA kernel overwrites dw and db
            dw = Tensor::empty(w.shape(), w.dtype(), w.device());
            db = Tensor::empty(w.shape(), w.dtype(), w.device());
            LOOM_IF_CUDA({
              Tensor scratch = detail::workspace(
                  in.device(), kernels::cuda::layer_norm_backward_workspace(rows, width));
              kernels::cuda::layer_norm_backward(
                  in.dtype(), dy.dtype(), dy.raw_data(), in.raw_data(), w.raw_data(),
                  mean.data<float>(), rstd.data<float>(), dx.raw_data(), dw.raw_data(),
                  db.raw_data(), rows, width, scratch.raw_data(), detail::stream_of(in));
            });
          } else {  // the CPU kernel accumulates into them
            dw = Tensor::zeros(w.shape(), w.dtype(), w.device());
            db = Tensor::zeros(w.shape(), w.dtype(), w.device());
            if (reports_op_cost(in.device())) {
              record_meta_op("LayerNorm", OpClass::Normalization,
                             2 * kNormFlops * double(in.numel()), {dy, in, w, mean, rstd},
                             {dx, dw, db});
            }
            if (in.device().is_meta()) {
            } else {
              dispatch_norm_storage(in.dtype(), dy.dtype(), "layer_norm",
                                    [&]<typename T, typename L>() {
                kernels::cpu::layer_norm_backward(dy.data<L>(), in.data<T>(), w.data<T>(),
                                                  mean.data<T>(), rstd.data<T>(), dx.data<T>(),
                                                  dw.data<T>(), db.data<T>(), rows, width);
              });
            }
          }
          return std::vector<Tensor>{node.needs_input_grad(0) ? dx : Tensor(),
                                     node.needs_input_grad(1) ? dw : Tensor(),
                                     node.needs_input_grad(2) ? db : Tensor()};
        });
  }
  return out;
}

namespace {

// The backward of add_norm's node, whose inputs are {x, residual, weight (, bias)} and outputs
// {sum, normed}, or without `sum_output` {normed}: `saved` the sum, the residual of
// `residual_dtype` (its gradient rounded to it in the same pass where that is `low`, not the
// sum's).
autograd::VjpFunction add_norm_backward(const char* op, bool centered, const Tensor& sum,
                                        const Tensor& w_in, const Tensor& mean,
                                        const Tensor& rstd, DType low, DType residual_dtype,
                                        bool sum_output = true) {
  const int64_t width = sum.size(-1);
  const int64_t rows = width ? sum.numel() / width : 0;
  const char* node_name = centered ? "AddLayerNorm" : "AddRmsNorm";
  return [saved = sum.detach(), w = w_in.detach(), mean, rstd, rows, width, low, residual_dtype,
          centered, op, node_name, sum_output](const std::vector<Tensor>& g,
                                               const autograd::Node& node) {
          const Device device = saved.device();
          const Tensor& dnormed = g[sum_output ? 1 : 0];
          Tensor dsum = sum_output ? g[0].contiguous() : Tensor();
          Tensor dy = dnormed.dtype() == low ? dnormed : cast(dnormed, low);
          dy = dy.contiguous();
          Tensor dx = Tensor::empty(saved.shape(), saved.dtype(), device);
          // A 16-bit residual's gradient: dx rounded to its dtype, in the same pass.
          Tensor dres = residual_dtype == saved.dtype() || !node.needs_input_grad(1)
                            ? Tensor()
                            : Tensor::empty(saved.shape(), low, device);
          // The CUDA kernel overwrites dw and db, the CPU kernel accumulates into them.
          const bool cuda_path = takes_cuda_path(device);
          auto parameter_gradient = [&] {
            return cuda_path ? Tensor::empty(w.shape(), w.dtype(), device)
                             : Tensor::zeros(w.shape(), w.dtype(), device);
          };
          Tensor dw = parameter_gradient(), db = centered ? parameter_gradient() : Tensor();
          if (reports_op_cost(device)) {
            const double flops =
                ((centered ? 2 * kNormFlops : kNormFlops) + 1) * double(saved.numel());
            std::vector<Tensor> reads{dy, saved, w, rstd}, writes{dx, dw};
            if (dsum.defined()) reads.push_back(dsum);
            if (centered) reads.push_back(mean), writes.push_back(db);
            if (dres.defined()) writes.push_back(dres);
            record_meta_op(node_name, OpClass::Normalization, flops, reads, writes);
          }
          if (device.is_cuda()) {
            LOOM_IF_CUDA({
              Tensor scratch = detail::workspace(
                  device, kernels::cuda::layer_norm_backward_workspace(rows, width));
              void* dres_data = dres.defined() ? dres.raw_data() : nullptr;
              const void* dsum_data = dsum.defined() ? dsum.raw_data() : nullptr;
              if (centered) {
                kernels::cuda::add_layer_norm_backward(
                    saved.dtype(), low, dy.raw_data(), dsum_data, saved.raw_data(),
                    w.raw_data(), mean.data<float>(), rstd.data<float>(), dx.raw_data(),
                    dres_data, dw.raw_data(), db.raw_data(), rows, width, scratch.raw_data(),
                    detail::stream_of(saved));
              } else {
                kernels::cuda::add_rms_norm_backward(
                    saved.dtype(), low, dy.raw_data(), dsum_data, saved.raw_data(),
                    w.raw_data(), rstd.data<float>(), dx.raw_data(), dres_data, dw.raw_data(),
                    rows, width, scratch.raw_data(), detail::stream_of(saved));
              }
            });
          } else if (!device.is_meta()) {
            dispatch_norm_storage(saved.dtype(), low, op, [&]<typename T, typename L>() {
              L* dres_data = dres.defined() ? dres.data<L>() : nullptr;
              const T* dsum_data = dsum.defined() ? dsum.data<T>() : nullptr;
              if (centered) {
                kernels::cpu::add_layer_norm_backward(
                    dy.data<L>(), dsum_data, saved.data<T>(), w.data<T>(), mean.data<T>(),
                    rstd.data<T>(), dx.data<T>(), dres_data, dw.data<T>(), db.data<T>(), rows,
                    width);
              } else {
                kernels::cpu::add_rms_norm_backward(dy.data<L>(), dsum_data,
                                                    saved.data<T>(), w.data<T>(), rstd.data<T>(),
                                                    dx.data<T>(), dres_data, dw.data<T>(), rows,
                                                    width);
              }
            });
          }
          // The sum's two operands get the same gradient (the residual's in its dtype).
          std::vector<Tensor> grads{node.needs_input_grad(0) ? dx : Tensor(),
                                    node.needs_input_grad(1) ? (dres.defined() ? dres : dx)
                                                             : Tensor(),
                                    node.needs_input_grad(2) ? dw : Tensor()};
          if (centered) grads.push_back(node.needs_input_grad(3) ? db : Tensor());
          return grads;
        };
}

// add_layer_norm (centered) and add_rms_norm (bias undefined) in one pass where a kernel
// computes what add and the norm would: x, the parameters and the sum of one dtype T (f32 or
// f64 on the CPU, a CUDA storage dtype on CUDA), of one shape with the residual; the output
// of T, or of autocast's 16-bit dtype for an f32 T (the norm writing its products' input); the
// residual of T or of the output's dtype (an f32 stream meeting a bf16 branch, or an f32
// tensor-parallel branch). Otherwise (broadcasting, other mixes, 16-bit weights under
// autocast) the two ops.
AddNorm add_norm(const char* op, bool centered, const Tensor& x, const Tensor& residual,
                 const Tensor& weight, const Tensor& bias, double eps,
                 std::optional<DType> out_dtype) {
  detail::check_kernel_device(op, x);
  detail::check_kernel_device(op, residual);
  const DType t = x.dtype(), low = out_dtype.value_or(t), residual_dtype = residual.dtype();
  const bool fused = in_one_pass(centered, x, weight, bias, low) &&
                     x.shape() == residual.shape() &&
                     (residual_dtype == low || residual_dtype == t);
  if (!fused) {
    Tensor sum = add(x, residual);
    return {sum, centered ? layer_norm(sum, weight, bias, eps, out_dtype)
                          : rms_norm(sum, weight, eps, out_dtype)};
  }
  // (Their dtypes may differ: only the devices are checked here.)
  if (x.device() != residual.device()) detail::check_same_kind(op, x, residual);
  if (centered) check_norm_parameters(op, x, weight, bias);
  else check_rms_weight(op, x, weight);
  const int64_t width = x.size(-1);
  const int64_t rows = width ? x.numel() / width : 0;
  Tensor in = detail::contiguous_input(x), res = detail::contiguous_input(residual),
         w = detail::contiguous_input(weight),
         b = centered ? detail::contiguous_input(bias) : Tensor();
  Tensor sum = Tensor::empty(x.shape(), t, x.device());
  Tensor out = Tensor::empty(x.shape(), low, x.device());
  // Row statistics as layer_norm's: x's dtype on the CPU, f32 on CUDA.
  const DType stats_dtype = x.device().is_cuda() ? DType::F32 : t;
  Tensor mean = centered ? Tensor::empty({rows}, stats_dtype, x.device()) : Tensor();
  Tensor rstd = Tensor::empty({rows}, stats_dtype, x.device());
  if (reports_op_cost(x.device())) {
    const double flops = ((centered ? kNormFlops : kNormFlops / 2) + 1) * double(x.numel());
    if (centered) {
      record_meta_op(op, OpClass::Normalization, flops, {in, res, w, b}, {sum, out, mean, rstd});
    } else {
      record_meta_op(op, OpClass::Normalization, flops, {in, res, w}, {sum, out, rstd});
    }
  }
  if (x.device().is_meta()) {
    // nothing to compute: the cost is reported above
  } else if (x.device().is_cuda()) {
    LOOM_IF_CUDA({
      if (centered) {
        kernels::cuda::add_layer_norm_forward(
            t, low, residual_dtype, in.raw_data(), res.raw_data(), w.raw_data(), b.raw_data(),
            sum.raw_data(), out.raw_data(), mean.data<float>(), rstd.data<float>(), rows, width,
            eps, detail::stream_of(x));
      } else {
        kernels::cuda::add_rms_norm_forward(t, low, residual_dtype, in.raw_data(),
                                            res.raw_data(), w.raw_data(), sum.raw_data(),
                                            out.raw_data(), rstd.data<float>(), rows, width, eps,
                                            detail::stream_of(x));
      }
    });
  } else {
    dispatch_norm_storage(t, low, op, [&]<typename T, typename L>() {
      const auto forward = [&]<typename R>() {
        if (centered) {
          kernels::cpu::add_layer_norm_forward(in.data<T>(), res.data<R>(), w.data<T>(),
                                               b.data<T>(), sum.data<T>(), out.data<L>(),
                                               mean.data<T>(), rstd.data<T>(), rows, width, eps);
        } else {
          kernels::cpu::add_rms_norm_forward(in.data<T>(), res.data<R>(), w.data<T>(),
                                             sum.data<T>(), out.data<L>(), rstd.data<T>(), rows,
                                             width, eps);
        }
      };
      if (residual_dtype == t) forward.template operator()<T>();
      else forward.template operator()<L>();
    });
  }
  if (autograd::any_requires_grad({x, residual, weight, bias})) {
    std::vector<Tensor> inputs{x, residual, weight};
    if (centered) inputs.push_back(bias);
    autograd::record(centered ? "AddLayerNorm" : "AddRmsNorm", inputs, {sum, out},
                     add_norm_backward(op, centered, sum, w, mean, rstd, low, residual_dtype));
  }
  return {sum, out};
}

// Note [A norm takes over the residual add before it]
// A pre-LN block reads its input x twice: its first norm and its residual stream. Backward then
// sums the two gradients x receives (a pass of its own), and where x is the block before's last
// residual add, an f32 stream plus a 16-bit branch (Note [An f32 tensor plus a 16-bit one] in
// elementwise.cpp), that add's backward casts the sum to 16 bits for the branch (another). The
// norm that keeps the stream (layer_norm_keeping_stream, rms_norm_keeping_stream) gives the
// block x as a second output, so both of x's gradients reach its node, whose backward adds the
// stream's to the norm's in its one pass (add_norm's backward, with no residual). And where x
// is such an add of operands of x's shape, the node records its edges to the add's operands
// instead of x (autograd::record_edges): its pass writes the stream's gradient and the
// branch's, rounded, as add_norm's writes a 16-bit residual's, and the add's backward never
// runs. The bits are those of the ops apart (the sum of the two gradients, then its
// rounding). A read of x other than through the node still reaches the add, whose backward
// then gives the operands its share: the same sums, but the branch's gradient then arrives as
// two roundings added instead of one. Across a boundary that wraps the block's output in a
// node of its own (an FSDP unit's backward entry, a pipeline stage's received activation, the
// input of activation checkpointing's recomputation) there is no add to take over, only the
// two gradients' sum to fuse. On CUDA, two launches fewer per block (the sum and the cast;
// test_emulated_training.cpp counts them).
//
// Without `keep_stream` the node has the normed output alone: a norm that ends the stream (a
// model's final norm after its last block), x's last reader.
AddNorm norm_keeping_stream(const char* op, bool centered, const Tensor& x, const Tensor& weight,
                            const Tensor& bias, double eps, std::optional<DType> out_dtype,
                            bool keep_stream = true) {
  const auto apart = [&] {
    return AddNorm{x, centered ? layer_norm(x, weight, bias, eps, out_dtype)
                               : rms_norm(x, weight, eps, out_dtype)};
  };
  detail::check_kernel_device(op, x);
  const DType t = x.dtype(), low = out_dtype.value_or(t);
  if (!in_one_pass(centered, x, weight, bias, low) ||
      !autograd::any_requires_grad({x, weight, bias}))
    return apart();
  if (centered) check_norm_parameters(op, x, weight, bias);
  else check_rms_weight(op, x, weight);
  Tensor in = detail::contiguous_input(x), w = detail::contiguous_input(weight),
         b = centered ? detail::contiguous_input(bias) : Tensor();
  const NormForward f = norm_forward(op, centered, in, w, b, eps, low);
  // The stream: x itself, as the node's output (a view of it).
  Tensor stream = Tensor::make_view(in, in.shape(), in.strides(), in.offset());
  // The edges: x's, or the operands' of the add x is (whose 16-bit operand has the output's
  // dtype), then none for the residual, the parameters'.
  std::vector<autograd::Edge> edges{autograd::gradient_edge(x), autograd::Edge{}};
  DType residual_dtype = t;
  const std::optional<detail::WideningAdd> add = detail::widening_add_operands(x);
  if (add && add->branch_dtype == low && low != t && x.is_contiguous()) {
    edges = {add->stream, add->branch};
    residual_dtype = low;
  }
  edges.push_back(autograd::gradient_edge(weight));
  if (centered) edges.push_back(autograd::gradient_edge(bias));
  std::vector<Tensor> outputs{f.out};
  if (keep_stream) outputs.insert(outputs.begin(), stream);
  autograd::record_edges(centered ? "AddLayerNorm" : "AddRmsNorm", std::move(edges), outputs,
                         add_norm_backward(op, centered, in, w, f.mean, f.rstd, low,
                                           residual_dtype, keep_stream));
  return {keep_stream ? stream : x, f.out};
}

}  // namespace

AddNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                       const Tensor& bias, double eps, std::optional<DType> out_dtype) {
  return add_norm("add_layer_norm", true, x, residual, weight, bias, eps, out_dtype);
}

AddNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     std::optional<DType> out_dtype) {
  return add_norm("add_rms_norm", false, x, residual, weight, Tensor(), eps, out_dtype);
}

Tensor rms_norm(const Tensor& x_in, const Tensor& weight_in, double eps,
                std::optional<DType> out_dtype) {
  const Tensor x = autocast_f32_input(x_in), weight = autocast_f32_input(weight_in);
  detail::check_kernel_device("rms_norm", x);
  check_rms_weight("rms_norm", x, weight);
  const DType y_dtype = norm_output_dtype("rms_norm", x, out_dtype);
  if (detail::computes_through_f32(x)) {  // as layer_norm
    return cast(rms_norm(cast(x, DType::F32), cast(weight, DType::F32), eps), y_dtype);
  }
  int64_t width = x.size(-1);
  int64_t rows = width ? x.numel() / width : 0;
  Tensor in = detail::contiguous_input(x), w = detail::contiguous_input(weight);
  const NormForward f = norm_forward("rms_norm", false, in, w, Tensor(), eps, y_dtype);
  const Tensor out = f.out, rstd = f.rstd;
  if (autograd::any_requires_grad({x, weight})) {
    autograd::record(
        "RmsNorm", {x, weight}, {out},
        [in = in.detach(), w = w.detach(), rstd, rows, width](const std::vector<Tensor>& g,
                                                              const autograd::Node& node) {
          Tensor dy = g[0].contiguous();
          Tensor dx = Tensor::empty(in.shape(), in.dtype(), in.device());
          Tensor dw;
          if (in.device().is_cuda()) {  // the CUDA kernel overwrites dw
            dw = Tensor::empty(w.shape(), w.dtype(), w.device());
            LOOM_IF_CUDA({
              Tensor scratch = detail::workspace(
                  in.device(), kernels::cuda::layer_norm_backward_workspace(rows, width));
              kernels::cuda::rms_norm_backward(in.dtype(), dy.dtype(), dy.raw_data(), in.raw_data(),
                                               w.raw_data(), rstd.data<float>(), dx.raw_data(),
                                               dw.raw_data(), rows, width, scratch.raw_data(),
                                               detail::stream_of(in));
            });
          } else {  // the CPU kernel accumulates into it
            dw = Tensor::zeros(w.shape(), w.dtype(), w.device());
            if (reports_op_cost(in.device())) {
              record_meta_op("RmsNorm", OpClass::Normalization, kNormFlops * double(in.numel()),
                             {dy, in, w, rstd}, {dx, dw});
            }
            if (in.device().is_meta()) {
            } else {
              dispatch_norm_storage(in.dtype(), dy.dtype(), "rms_norm",
                                    [&]<typename T, typename L>() {
                kernels::cpu::rms_norm_backward(dy.data<L>(), in.data<T>(), w.data<T>(),
                                                rstd.data<T>(), dx.data<T>(), dw.data<T>(), rows,
                                                width);
              });
            }
          }
          return std::vector<Tensor>{node.needs_input_grad(0) ? dx : Tensor(),
                                     node.needs_input_grad(1) ? dw : Tensor()};
        });
  }
  return out;
}

AddNorm layer_norm_keeping_stream(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                  double eps, std::optional<DType> out_dtype) {
  return norm_keeping_stream("layer_norm", true, x, weight, bias, eps, out_dtype);
}

AddNorm rms_norm_keeping_stream(const Tensor& x, const Tensor& weight, double eps,
                                std::optional<DType> out_dtype) {
  return norm_keeping_stream("rms_norm", false, x, weight, Tensor(), eps, out_dtype);
}

Tensor layer_norm_ending_stream(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 double eps, std::optional<DType> out_dtype) {
  return norm_keeping_stream("layer_norm", true, x, weight, bias, eps, out_dtype, false).normed;
}

Tensor rms_norm_ending_stream(const Tensor& x, const Tensor& weight, double eps,
                              std::optional<DType> out_dtype) {
  return norm_keeping_stream("rms_norm", false, x, weight, Tensor(), eps, out_dtype, false)
      .normed;
}

}  // namespace loom
