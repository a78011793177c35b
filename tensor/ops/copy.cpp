// Copies, casts and fills: the ops that move elements without arithmetic.

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/thread_pool.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/check.h"
#include "kernels/cuda/copy.h"
#include "tensor/cuda/copy.h"
#endif

namespace loom {

namespace {

// Element value conversions through a common type: int64 between integers, double otherwise.
template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return bf16_bits_to_float(v.bits);
  else if constexpr (std::is_same_v<T, Half>)
    return f16_bits_to_float(v.bits);
  else
    return static_cast<double>(v);
}

template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, BFloat16>)
    return {float_to_bf16_bits(static_cast<float>(v))};
  else if constexpr (std::is_same_v<T, Half>)
    return {float_to_f16_bits(static_cast<float>(v))};
  else
    return static_cast<T>(v);
}

template <typename Src, typename Dst>
void convert_loop(const void* src, void* dst, int64_t n) {
  const Src* s = static_cast<const Src*>(src);
  Dst* d = static_cast<Dst*>(dst);
  if constexpr (std::is_integral_v<Src> && std::is_integral_v<Dst>) {
    for (int64_t i = 0; i < n; ++i)
      d[i] = static_cast<Dst>(s[i]);
  } else if constexpr (std::is_same_v<Src, float> && std::is_same_v<Dst, BFloat16>) {
    for (int64_t i = 0; i < n; ++i)
      d[i].bits = float_to_bf16_bits(s[i]);
  } else if constexpr (std::is_same_v<Src, BFloat16> && std::is_same_v<Dst, float>) {
    for (int64_t i = 0; i < n; ++i)
      d[i] = bf16_bits_to_float(s[i].bits);
  } else {
    for (int64_t i = 0; i < n; ++i)
      d[i] = from_double<Dst>(to_double(s[i]));
  }
}

// Converts n contiguous elements of src_dtype into dst_dtype, shared out among the intra-op
// threads (each element on its own: the same bits on any count).
void convert(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n) {
  visit_dtype(src_dtype, [&]<typename Src>() {
    visit_dtype(dst_dtype, [&]<typename Dst>() {
      kernels::cpu::parallel_for(n, kernels::cpu::kMinParallelElements,
                                 [&](int64_t first, int64_t last) {
                                   convert_loop<Src, Dst>(static_cast<const Src*>(src) + first,
                                                          static_cast<Dst*>(dst) + first,
                                                          last - first);
                                 });
    });
  });
}

}  // namespace

bool detail::is_dense(const Tensor& x) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of dims of size > 1
  for (int64_t d = 0; d < x.dim(); ++d)
    if (x.size(d) != 1) dims.emplace_back(x.strides()[d], x.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expected = 1;
  for (const auto& [stride, size] : dims) {
    if (stride != expected) return false;
    expected *= size;
  }
  return true;
}

namespace {

void check_contiguous_dst(const char* op, const Tensor& dst) {
  detail::check_kernel_device(op, dst);
  if (!dst.is_contiguous())
    fail(op, ": destination must be contiguous, got strides ", shape_str(dst.strides()),
         " for shape ", shape_str(dst.shape()));
}

// Copies between devices: src is packed and converted to dst's dtype on its own device,
// then its bytes move on the CUDA side's current stream (the destination's between two
// GPUs, after the source's stream has drained). A copy into host memory has finished when
// this returns: cuda::copy_bytes leaves a copy into pinned memory in flight, so the stream is
// synchronised here (until 2026-12-06 it was not, and a read of a pinned destination, such
// as the offloaded engine's gradient shards, could race the copy on a GPU).
void copy_across_devices(Tensor& dst, const Tensor& src) {
  NoGradGuard no_grad;
  Tensor packed = src.contiguous().to(dst.dtype());
  if (src.device().is_meta() || dst.device().is_meta()) {
    if (src.device().is_cuda() || dst.device().is_cuda()) {
      fail("copy_: no copy between ", src.device(), " and ", dst.device(),
           "; meta tensors copy to and from the CPU only");
    }
    record_meta_op("copy_across_devices", OpClass::Transfer, 0, {packed}, {dst});
    // A meta tensor reads as zeros (Note [The meta device] in tensor/meta.h).
    if (dst.device().is_cpu()) std::memset(dst.raw_data(), 0, dst.nbytes());
    return;
  }
#if LOOM_WITH_CUDA
  if (src.device().is_cuda() && dst.device().is_cuda()) {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(detail::stream_of(packed)));
  }
#endif
#if LOOM_WITH_CUDA
  const cudaStream_t stream = detail::stream_of(dst.device().is_cuda() ? dst : src);
  cuda::copy_bytes(dst.raw_data(), dst.device(), packed.raw_data(), packed.device(), dst.nbytes(),
                   stream);
  if (dst.device().is_cpu()) LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
#endif
}

}  // namespace

void fill_(Tensor& a, double value) {
  check_contiguous_dst("fill_", a);
  int64_t n = a.numel();
  if (reports_op_cost(a.device())) {
    record_meta_op("fill_", OpClass::Copy, 0, {}, {a});
  }
  if (a.device().is_meta()) return;
  if (a.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::fill(a.dtype(), a.raw_data(), value, n, detail::stream_of(a)));
    return;
  }
  visit_dtype(a.dtype(), [&]<typename T>() {
    T v = from_double<T>(value);
    T* p = static_cast<T*>(a.raw_data());
    for (int64_t i = 0; i < n; ++i)
      p[i] = v;
  });
}

void copy_(Tensor& dst, const Tensor& src) {
  check_contiguous_dst("copy_", dst);
  detail::check_kernel_device("copy_", src);
  if (src.shape() != dst.shape()) {
    fail("copy_: source shape ", shape_str(src.shape()), " does not match destination shape ",
         shape_str(dst.shape()));
  }
  if (src.numel() == 0) return;
  if (src.device() != dst.device()) return copy_across_devices(dst, src);
  if (src.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::copy_strided(src.dtype(), static_cast<int>(src.dim()),
                                             src.shape().data(), src.raw_data(),
                                             src.strides().data(), dst.dtype(), dst.raw_data(),
                                             detail::stream_of(src)));
    return;
  }
  const bool meta = src.device().is_meta();
  if (src.dtype() == dst.dtype()) {
    if (reports_op_cost(src.device())) {
      record_meta_op("copy_", OpClass::Copy, 0, {src}, {dst});
    }
    if (meta) return;
    kernels::cpu::copy_strided(dtype_size(src.dtype()), static_cast<int>(src.dim()),
                               src.shape().data(), src.raw_data(), src.strides().data(),
                               dst.raw_data());
    return;
  }
  // A strided source is packed first on the CPU; CUDA's copy_strided converts as it gathers, in
  // one kernel, which meta following CUDA reports as one cast.
  Tensor packed = src;
  if (!src.is_contiguous() && !takes_cuda_path(src.device())) {
    packed = Tensor::empty(src.shape(), src.dtype(), src.device());
    copy_(packed, src);
  }
  if (reports_op_cost(src.device())) {
    record_meta_op("cast", OpClass::Copy, 0, {packed}, {dst});
  }
  if (meta) return;
  convert(packed.dtype(), packed.raw_data(), dst.dtype(), dst.raw_data(), dst.numel());
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  copy_(out, x);
  if (autograd::any_requires_grad({x})) {
    autograd::record("Contiguous", {x}, {out},
                     [](const std::vector<Tensor>& g, const autograd::Node&) { return g; });
  }
  return out;
}

Tensor cast(const Tensor& x, DType dtype) {
  Tensor out;
  if (!x.is_contiguous() && !takes_cuda_path(x.device()) && detail::is_dense(x)) {
    // As PyTorch's preserve_format: the elements converted where they lie, the result viewed
    // with x's strides (a transposed weight stays transposed, and is not copied twice).
    NoGradGuard no_grad;
    Tensor span = Tensor::make_view(x, {x.numel()}, {1}, x.offset());
    Tensor converted = Tensor::empty({x.numel()}, dtype, x.device());
    copy_(converted, span);
    out = Tensor::make_view(converted, x.shape(), x.strides(), 0);
  } else {
    out = Tensor::empty(x.shape(), dtype, x.device());
    copy_(out, x);
  }
  detail::record_cast(x, out);
  return out;
}

void detail::record_cast(const Tensor& x, const Tensor& out) {
  if (!autograd::any_requires_grad({x})) return;
  const DType from = x.dtype(), to = out.dtype();
  if (!is_floating(to)) fail("cast: cannot differentiate through a cast to ", to);
  // A cast from f32 to 16 bits takes its gradient in f32 too (Note [Weight gradients in f32]
  // in autocast.cpp): passed on as it is.
  autograd::record("Cast", {x}, {out}, [from](const std::vector<Tensor>& g, const autograd::Node&) {
    return std::vector<Tensor>{g[0].dtype() == from ? g[0] : cast(g[0], from)};
  });
  if (from == DType::F32 && is_16bit_float(to)) autograd::accept_wider_gradient(out, from);
}

std::vector<Tensor> detail::cast_each(const std::vector<Tensor>& xs, DType dtype) {
  std::vector<Tensor> out;
  if (xs.empty()) return out;
  const Device device = xs.front().device();
  for (const Tensor& x : xs) {
    check(x.defined() && x.is_contiguous() && x.dtype() == DType::F32 && x.device() == device,
          "cast_each: expected contiguous f32 tensors on one device");
  }
  if (dtype != DType::BF16 && dtype != DType::F16)
    fail("cast_each: expected bf16 or f16, got ", dtype_name(dtype));
  for (const Tensor& x : xs)
    out.push_back(Tensor::empty(x.shape(), dtype, device));
  if (!takes_cuda_path(device)) {  // the CPU casts each in turn; meta following the CPU too
    for (size_t i = 0; i < xs.size(); ++i)
      copy_(out[i], xs[i]);
    return out;
  }
  if (reports_op_cost(device)) record_meta_op("cast", OpClass::Copy, 0, xs, out);
  if (device.is_meta()) return out;
#if LOOM_WITH_CUDA
  std::vector<const void*> sources;
  std::vector<void*> targets;
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < xs.size(); ++i) {
    sources.push_back(xs[i].raw_data());
    targets.push_back(out[i].raw_data());
    sizes.push_back(xs[i].numel());
  }
  kernels::cuda::multi_tensor_cast(DType::F32, dtype, sources.data(), targets.data(),
                                   sizes.data(), static_cast<int>(xs.size()),
                                   detail::stream_of(xs.front()));
#endif
  return out;
}

}  // namespace loom
