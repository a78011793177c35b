// Views and re-arrangements: reshape, permute, transpose, narrow, expand, concat, split.

#include <cstring>
#include <numeric>
#include <optional>

#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/check.h"
#endif

namespace loom {

namespace {

Shape resolve_shape(const Shape& requested, int64_t numel, const Shape& from) {
  Shape shape = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) fail("reshape: more than one -1 in ", shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else if (shape[i] < 0) {
      fail("reshape: invalid dimension ", shape[i], " in ", shape_str(requested));
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0) {
      fail("reshape: cannot reshape ", shape_str(from), " into ", shape_str(requested));
    }
    shape[infer] = numel / known;
  }
  if (numel_of(shape) != numel) {
    fail("reshape: cannot reshape ", shape_str(from), " (", numel, " elements) into ",
         shape_str(requested));
  }
  return shape;
}

// Strides that let `shape` view memory laid out as (from_shape, from_strides), or nothing when
// the layout cannot be expressed without a copy. Dimensions are grouped into chunks that are
// contiguous in memory; each chunk must be re-split exactly by the new shape.
std::optional<Shape> view_strides(const Shape& from_shape, const Shape& from_strides,
                                  const Shape& shape) {
  if (numel_of(from_shape) == 0 || from_shape.empty()) return contiguous_strides(shape);
  Shape strides(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_stride = from_strides.back();
  int64_t chunk_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(from_shape.size()) - 1; d >= 0; --d) {
    chunk_numel *= from_shape[d];
    bool chunk_ends =
        d == 0 || (from_shape[d - 1] != 1 && from_strides[d - 1] != chunk_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < chunk_numel || shape[view_d] == 1)) {
      strides[view_d] = view_numel * chunk_stride;
      view_numel *= shape[view_d];
      --view_d;
    }
    if (view_numel != chunk_numel) return std::nullopt;
    if (d > 0) {
      chunk_stride = from_strides[d - 1];
      chunk_numel = 1;
      view_numel = 1;
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}

Tensor narrow_view(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Shape shape = x.shape();
  shape[dim] = length;
  return Tensor::make_view(x, shape, x.strides(), x.offset() + start * x.strides()[dim]);
}

}  // namespace

Tensor reshape(const Tensor& x, const Shape& requested) {
  Shape shape = resolve_shape(requested, x.numel(), x.shape());
  std::optional<Shape> strides = view_strides(x.shape(), x.strides(), shape);
  Tensor base = strides ? x : contiguous(x);
  if (!strides) strides = contiguous_strides(shape);
  Tensor out = Tensor::make_view(base, shape, *strides, base.offset());
  if (autograd::any_requires_grad({base})) {
    autograd::record("Reshape", {base}, {out},
                     [from = x.shape()](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{reshape(g[0], from)};
                     });
  }
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t ndim = x.dim();
  if (static_cast<int64_t>(dims.size()) != ndim) {
    fail("permute: got ", dims.size(), " dimensions for a tensor with ", ndim);
  }
  Shape shape(ndim), strides(ndim);
  std::vector<int64_t> inverse(ndim, -1);
  for (int64_t i = 0; i < ndim; ++i) {
    int64_t d = wrap_dim(dims[i], ndim, "permute");
    if (inverse[d] >= 0) fail("permute: dimension ", d, " appears twice");
    inverse[d] = i;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  Tensor out = Tensor::make_view(x, shape, strides, x.offset());
  if (autograd::any_requires_grad({x})) {
    autograd::record("Permute", {x}, {out},
                     [inverse](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{permute(g[0], inverse)};
                     });
  }
  return out;
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(x.dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(dim0, x.dim(), "transpose")], dims[wrap_dim(dim1, x.dim(), "transpose")]);
  return permute(x, dims);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  dim = wrap_dim(dim, x.dim(), "narrow");
  int64_t extent = x.shape()[dim];
  if (start < 0 || length < 0 || start + length > extent) {
    fail("narrow: range [", start, ", ", start + length, ") is outside [0, ", extent,
         ") of dimension ", dim);
  }
  Tensor out = narrow_view(x, dim, start, length);
  if (autograd::any_requires_grad({x})) {
    autograd::record("Narrow", {x}, {out},
                     [shape = x.shape(), dim, start, length](const std::vector<Tensor>& g,
                                                             const autograd::Node&) {
                       Shape before = shape, after = shape;
                       before[dim] = start;
                       after[dim] = shape[dim] - start - length;
                       Tensor zb = Tensor::zeros(before, g[0].dtype(), g[0].device());
                       Tensor za = Tensor::zeros(after, g[0].dtype(), g[0].device());
                       return std::vector<Tensor>{concat({zb, g[0], za}, dim)};
                     });
  }
  return out;
}

Tensor expand(const Tensor& x, const Shape& requested) {
  if (requested.size() < x.shape().size()) {
    fail("expand: cannot expand ", shape_str(x.shape()), " to fewer dimensions ",
         shape_str(requested));
  }
  size_t lead = requested.size() - x.shape().size();
  Shape shape(requested.size()), strides(requested.size(), 0);
  for (size_t i = 0; i < requested.size(); ++i) {
    if (i < lead) {
      if (requested[i] < 0) fail("expand: -1 is not allowed for new leading dimension ", i);
      shape[i] = requested[i];
      continue;
    }
    int64_t have = x.shape()[i - lead];
    int64_t want = requested[i] == -1 ? have : requested[i];
    if (have != want && have != 1) {
      fail("expand: cannot expand ", shape_str(x.shape()), " to ", shape_str(requested),
           " (dimension ", i, " has size ", have, ", which is not 1)");
    }
    shape[i] = want;
    strides[i] = have == want ? x.strides()[i - lead] : 0;
  }
  Tensor out = Tensor::make_view(x, shape, strides, x.offset());
  if (autograd::any_requires_grad({x})) {
    autograd::record("Expand", {x}, {out},
                     [from = x.shape()](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{sum_to(g[0], from)};
                     });
  }
  return out;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  check(!xs.empty(), "concat: needs at least one tensor");
  const Tensor& first = xs[0];
  dim = wrap_dim(dim, first.dim(), "concat");
  Shape shape = first.shape();
  shape[dim] = 0;
  std::vector<Tensor> parts;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {
    detail::check_kernel_device("concat", xs[i]);
    detail::check_same_kind("concat", first, xs[i]);
    bool compatible = xs[i].dim() == first.dim();
    for (int64_t d = 0; compatible && d < first.dim(); ++d) {
      compatible = d == dim || xs[i].shape()[d] == first.shape()[d];
    }
    if (!compatible) {
      fail("concat: tensor ", i, " has shape ", shape_str(xs[i].shape()), ", which does not match ",
           shape_str(first.shape()), " outside dimension ", dim);
    }
    shape[dim] += xs[i].shape()[dim];
    sizes.push_back(xs[i].shape()[dim]);
    NoGradGuard no_grad;
    parts.push_back(xs[i].contiguous());
  }
  Tensor out = Tensor::empty(shape, first.dtype(), first.device());
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d)
    outer *= shape[d];
  for (int64_t d = dim + 1; d < first.dim(); ++d)
    inner *= shape[d];
  size_t element = dtype_size(first.dtype());
  const bool meta = out.device().is_meta();
  char* dst = meta ? nullptr : static_cast<char*>(out.raw_data());
  if (reports_op_cost(out.device())) {
    record_meta_op("concat", OpClass::Copy, 0, {out}, {out});
  }
  if (meta) {
    // no bytes to copy (the cost is reported above)
  } else if (first.device().is_cuda()) {
    // One 2-D copy per part: `outer` rows of the part's chunk into the output's wider rows.
    [[maybe_unused]] size_t row = static_cast<size_t>(shape[dim] * inner) * element;
    for (const Tensor& part : parts) {
      size_t chunk = static_cast<size_t>(part.shape()[dim] * inner) * element;
      if (chunk > 0 && outer > 0) {
        LOOM_IF_CUDA(LOOM_CUDA_CHECK(cudaMemcpy2DAsync(dst, row, part.raw_data(), chunk, chunk,
                                                       static_cast<size_t>(outer),
                                                       cudaMemcpyDeviceToDevice,
                                                       detail::stream_of(first))));
      }
      dst += chunk;
    }
  } else {
    for (int64_t o = 0; o < outer; ++o) {
      for (const Tensor& part : parts) {
        size_t chunk = static_cast<size_t>(part.shape()[dim] * inner) * element;
        if (chunk == 0) continue;  // a part of 0 elements may have no storage (null data)
        std::memcpy(dst, static_cast<const char*>(part.raw_data()) + o * chunk, chunk);
        dst += chunk;
      }
    }
  }
  if (autograd::any_requires_grad(xs)) {
    autograd::record("Concat", xs, {out},
                     [sizes, dim](const std::vector<Tensor>& g, const autograd::Node&) {
                       return split(g[0], sizes, dim);
                     });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  if (total != x.shape()[dim]) {
    fail("split: sizes sum to ", total, " but dimension ", dim, " of ", shape_str(x.shape()),
         " has ", x.shape()[dim]);
  }
  std::vector<Tensor> outs;
  int64_t start = 0;
  for (int64_t size : sizes) {
    outs.push_back(narrow_view(x, dim, start, size));
    start += size;
  }
  if (autograd::any_requires_grad({x})) {
    autograd::record("Split", {x}, outs,
                     [dim](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{concat(g, dim)};
                     });
  }
  return outs;
}

}  // namespace loom
