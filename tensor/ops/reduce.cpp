// Reductions: sum, mean, max, and sum_to (the vjp of broadcasting).

#include <algorithm>

#include "kernels/cpu/reduce.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/reduce.h"
#endif

namespace loom {

namespace {

struct AxisSplit {
  int64_t outer = 1, extent = 1, inner = 1;
};

AxisSplit split_at(const Shape& shape, int64_t dim) {
  AxisSplit s;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim)
      s.outer *= shape[d];
    else if (d == dim)
      s.extent = shape[d];
    else
      s.inner *= shape[d];
  }
  return s;
}

// Sums over one dimension of a contiguous tensor, keeping it with size 1. No autograd. A
// 16-bit x is summed into f32 on the CPU (its kernel widens each element as it reads it), and
// elsewhere with `widen`.
Tensor sum_one_dim(const Tensor& x, int64_t dim, bool widen) {
  AxisSplit s = split_at(x.shape(), dim);
  Shape shape = x.shape();
  shape[dim] = 1;
  const bool into_f32 = detail::computes_through_f32(x) || (widen && is_16bit_float(x.dtype()));
  Tensor out = Tensor::empty(shape, into_f32 ? DType::F32 : x.dtype(), x.device());
  if (reports_op_cost(x.device())) {
    record_meta_op("sum", OpClass::Reduction, double(x.numel()), {x}, {out});
  }
  if (x.device().is_meta()) return out;
  if (x.device().is_cuda()) {
    LOOM_IF_CUDA({
      Tensor scratch = detail::workspace(x.device(), kernels::cuda::sum_axis_workspace_bytes(
                                                         x.dtype(), s.outer, s.extent, s.inner));
      kernels::cuda::sum_axis(x.dtype(), out.dtype(), x.raw_data(), out.raw_data(), s.outer,
                              s.extent, s.inner, scratch.raw_data(), detail::stream_of(x));
    });
    return out;
  }
  detail::dispatch_floating_storage(x.dtype(), "sum", [&]<typename T>() {
    using C = kernels::cpu::compute_of<T>;
    kernels::cpu::sum_axis<T>(x.data<T>(), out.data<C>(), s.outer, s.extent, s.inner);
  });
  return out;
}

std::vector<int64_t> normalized_dims(const std::vector<int64_t>& dims, int64_t ndim,
                                     const char* op) {
  std::vector<int64_t> out;
  for (int64_t d : dims)
    out.push_back(wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end()) {
    fail(op, ": a dimension is listed twice");
  }
  return out;
}

}  // namespace

namespace {

// The sum of every element as a 0-d tensor of x's dtype, never recorded.
Tensor sum_all_forward(const Tensor& x) {
  if (detail::computes_through_f32(x)) {
    NoGradGuard no_grad;
    return cast(sum_all_forward(detail::widened(x)), x.dtype());
  }
  Tensor in = detail::contiguous_input(x);
  Tensor out = Tensor::empty({}, x.dtype(), x.device());
  if (reports_op_cost(x.device())) {
    record_meta_op("sum", OpClass::Reduction, double(x.numel()), {in}, {out});
  }
  if (x.device().is_meta()) return out;
  if (x.device().is_cuda()) {
    LOOM_IF_CUDA({
      Tensor scratch =
          detail::workspace(x.device(), kernels::cuda::reduce_workspace_bytes(in.numel()));
      kernels::cuda::sum_all(x.dtype(), in.raw_data(), in.numel(), out.raw_data(),
                             scratch.raw_data(), detail::stream_of(x));
    });
    return out;
  }
  detail::dispatch_floating(x.dtype(), "sum", [&]<typename T>() {
    *out.data<T>() = static_cast<T>(kernels::cpu::sum_all<T>(in.data<T>(), in.numel()));
  });
  return out;
}

}  // namespace

Tensor sum(const Tensor& x) {
  detail::check_kernel_device("sum", x);
  Tensor out = sum_all_forward(x);
  if (autograd::any_requires_grad({x})) {
    autograd::record("Sum", {x}, {out},
                     [shape = x.shape()](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{expand(g[0], shape)};
                     });
  }
  return out;
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  return sum(x, dims_in, keepdim, x.dtype());
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim, DType dtype) {
  detail::check_kernel_device("sum", x);
  if (dtype != x.dtype() && !(dtype == DType::F32 && is_16bit_float(x.dtype()))) {
    fail("sum: a ", dtype_name(x.dtype()), " tensor is summed in ", dtype_name(x.dtype()),
         is_16bit_float(x.dtype()) ? " or f32" : "", ", got dtype ", dtype_name(dtype));
  }
  std::vector<int64_t> dims = normalized_dims(dims_in, x.dim(), "sum");
  // bf16 and f16 on the CPU, or summed into f32: summed in f32 over every dimension (from the
  // first one summed, sum_one_dim), rounded once where the result is 16-bit.
  Tensor out = detail::contiguous_input(x);
  {
    NoGradGuard no_grad;
    for (int64_t d : dims)
      out = sum_one_dim(out, d, dtype == DType::F32);
    if (out.dtype() != dtype) out = cast(out, dtype);
  }
  Shape kept = out.shape();
  if (!keepdim) {
    Shape squeezed;
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (!std::binary_search(dims.begin(), dims.end(), d)) squeezed.push_back(x.shape()[d]);
    }
    out = Tensor::make_view(out, squeezed, contiguous_strides(squeezed), out.offset());
  } else {
    out = out.detach();
  }
  if (autograd::any_requires_grad({x})) {
    autograd::record("SumDims", {x}, {out},
                     [shape = x.shape(), kept, x_dtype = x.dtype()](const std::vector<Tensor>& g,
                                                                    const autograd::Node&) {
                       const Tensor grad = g[0].dtype() == x_dtype ? g[0] : cast(g[0], x_dtype);
                       return std::vector<Tensor>{expand(reshape(grad, kept), shape)};
                     });
  }
  return out;
}

Tensor mean(const Tensor& x) {
  return mul(sum(x), 1.0 / static_cast<double>(x.numel()));
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  int64_t count = 1;
  for (int64_t d : dims)
    count *= x.shape()[wrap_dim(d, x.dim(), "mean")];
  return mul(sum(x, dims, keepdim), 1.0 / static_cast<double>(count));
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  detail::check_kernel_device("max", x);
  // Not on a training step's path: a CUDA tensor takes the CPU route (two copies).
  if (x.device().is_cuda()) return max(x.to(Device::cpu()), dim, keepdim).to(x.device());
  dim = wrap_dim(dim, x.dim(), "max");
  if (x.shape()[dim] == 0) fail("max: dimension ", dim, " of ", shape_str(x.shape()), " is empty");
  Tensor in = detail::contiguous_input(x);
  AxisSplit s = split_at(x.shape(), dim);
  Shape kept = x.shape();
  kept[dim] = 1;
  Tensor values = Tensor::empty(kept, x.dtype(), x.device());
  auto argmax = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(s.outer * s.inner));
  if (reports_op_cost(x.device())) {
    record_meta_op("max", OpClass::Reduction, double(x.numel()), {in}, {values});
  }
  if (x.device().is_meta()) {  // every argmax reads as 0
  } else {
    detail::dispatch_floating(x.dtype(), "max", [&]<typename T>() {
      kernels::cpu::max_axis<T>(in.data<T>(), values.data<T>(), argmax->data(), s.outer, s.extent,
                                s.inner);
    });
  }
  Tensor out = values;
  if (!keepdim) {
    Shape squeezed = x.shape();
    squeezed.erase(squeezed.begin() + dim);
    out = Tensor::make_view(values, squeezed, contiguous_strides(squeezed), 0);
  }
  if (autograd::any_requires_grad({x})) {
    autograd::record(
        "Max", {x}, {out},
        [shape = x.shape(), s, argmax](const std::vector<Tensor>& g, const autograd::Node&) {
          Tensor dy = g[0].contiguous();
          Tensor dx = Tensor::zeros(shape, dy.dtype(), dy.device());
          if (reports_op_cost(dx.device())) {
            record_meta_op("Max", OpClass::Copy, 0, {dy}, {dy});
          }
          if (dx.device().is_meta()) return std::vector<Tensor>{dx};
          detail::dispatch_floating(dy.dtype(), "max", [&]<typename T>() {
            const T* src = dy.data<T>();
            T* dst = dx.data<T>();
            for (int64_t o = 0; o < s.outer; ++o) {
              for (int64_t i = 0; i < s.inner; ++i) {
                int64_t at = o * s.inner + i;
                dst[(o * s.extent + (*argmax)[at]) * s.inner + i] = src[at];
              }
            }
          });
          return std::vector<Tensor>{dx};
        });
  }
  return out;
}

Tensor max(const Tensor& x) {
  return max(reshape(x, {-1}), 0, false);
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  if (shape.size() > x.shape().size()) {
    fail("sum_to: cannot reduce ", shape_str(x.shape()), " to ", shape_str(shape));
  }
  size_t lead = x.shape().size() - shape.size();
  std::vector<int64_t> dims;
  for (size_t i = 0; i < x.shape().size(); ++i) {
    if (i < lead) {
      dims.push_back(static_cast<int64_t>(i));
    } else if (shape[i - lead] == 1 && x.shape()[i] != 1) {
      dims.push_back(static_cast<int64_t>(i));
    } else if (shape[i - lead] != x.shape()[i]) {
      fail("sum_to: cannot reduce ", shape_str(x.shape()), " to ", shape_str(shape));
    }
  }
  return reshape(sum(x, dims, /*keepdim=*/true), shape);
}

}  // namespace loom
