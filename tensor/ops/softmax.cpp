// Softmax (optionally causal) and the fused softmax cross-entropy loss.

#include <cmath>
#include <limits>
#include <optional>

#include "kernels/cpu/softmax.h"
#include "tensor/autocast.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/softmax.h"
#endif

namespace loom {

// Note [The loss's gradient with the loss]
// A language model's loss reads [N, V] logits (824 MB in bf16 for GPT-2 small's 8 x 1024
// tokens), and its backward reads them again to write their gradient over them: the logits
// cross memory three times. A trainer knows the gradient its backward will start from before
// the forward runs (Strategy::forward_backward multiplies the loss by its scale, times a loss
// scaler's, and says so with a LossGradientScope), and logits passed on at once from their
// product (linear_cross_entropy's) are seen by nothing else. CUDA's cross_entropy then
// writes the gradient in its forward (kernels::cuda::cross_entropy_forward_backward: each row
// read, then read again from L2 as it is overwritten): twice across memory instead of three
// times, and the bits the backward kernel writes for that gradient. The backward checks on
// the device that the loss's gradient is the one announced: when it is, it returns what the
// forward wrote; when not (a loss scaled after the scope's word, or summed with another), it
// rescales it (one more pass, rounded once more). Liger-Kernel's and Loom's CPU
// linear_cross_entropy (Note [The classifier without its logits]) compute the gradient in the
// forward too, for a gradient of 1, and scale it in backward. Meta following CUDA reports the
// same work, assuming the word kept.

namespace {

thread_local std::optional<float> announced_loss_gradient;

}  // namespace

LossGradientScope::LossGradientScope(double gradient) : previous_(announced_loss_gradient) {
  const auto g = static_cast<float>(gradient);
  announced_loss_gradient = std::isfinite(g) && g != 0.0f ? std::optional<float>(g) : std::nullopt;
}

LossGradientScope::~LossGradientScope() {
  announced_loss_gradient = previous_;
}

std::optional<float> LossGradientScope::gradient() {
  return announced_loss_gradient;
}

namespace {

// FLOPs per element of a softmax (or the cross-entropy's) as the meta device counts them: the
// row's maximum, the exponential, the sum and the division; backward the same again. These
// ops are bandwidth-bound: the time model goes by their bytes.
constexpr double kSoftmaxFlops = 4;

// The buffer for the logits' gradient: the logits themselves when this backward is the last use
// of them and nothing outside the node holds their storage (every kernel lets dlogits alias
// logits), so that the [rows, vocab] gradient needs no memory of its own (0.8 GB of GPT-2
// small's batch of 8 x 1024 in bf16); else a new tensor. Logits a caller keeps stay intact.
Tensor logits_gradient_buffer(const Tensor& saved, const autograd::Node& node) {
  if (node.last_use() && saved.storage().use_count() == 1) return saved;
  return Tensor::empty(saved.shape(), saved.dtype(), saved.device());
}

// cross_entropy on a GPU: targets are moved to the logits' device as i64 (host targets are
// uploaded) and checked there (an out-of-range target stops the kernel with a device-side
// error naming it); the gradient of the loss is read on the device, so that neither
// direction waits for the host.
// `announced`: the loss's gradient, when the forward writes the logits' gradient over them
// (Note [The loss's gradient with the loss]).
Tensor cuda_cross_entropy(const Tensor& logits, const Tensor& targets,
                          std::optional<float> announced) {
  if (targets.dtype() != DType::I64 && targets.dtype() != DType::I32) {
    fail("cross_entropy (targets): indices must be i32 or i64, got ", targets.dtype());
  }
  int64_t rows = logits.size(0), vocab = logits.size(1);
  Tensor in = detail::contiguous_input(logits);
  Tensor index = targets.to(logits.device()).to(DType::I64).contiguous();
  Tensor lse = Tensor::empty({rows}, DType::F32, logits.device());
  Tensor row_losses = Tensor::empty({rows}, DType::F32, logits.device());
  Tensor out = Tensor::empty({}, DType::F32, logits.device());
  if (announced) {
    LOOM_IF_CUDA(kernels::cuda::cross_entropy_forward_backward(
        logits.dtype(), in.raw_data(), index.data<int64_t>(), lse.data<float>(),
        row_losses.data<float>(), out.data<float>(), *announced, rows, vocab,
        detail::stream_of(logits)));
    autograd::record("CrossEntropy", {logits}, {out},
                     [dlogits = in.detach(), expected = *announced](const std::vector<Tensor>& g,
                                                                    const autograd::Node& node) {
                       Tensor d = node.last_use() ? dlogits : dlogits.clone();
                       LOOM_IF_CUDA(kernels::cuda::cross_entropy_rescale(
                           d.dtype(), d.raw_data(), g[0].contiguous().data<float>(), expected,
                           d.numel(), detail::stream_of(d)));
                       return std::vector<Tensor>{d};
                     });
    return out;
  }
  LOOM_IF_CUDA(kernels::cuda::cross_entropy_forward(
      logits.dtype(), in.raw_data(), index.data<int64_t>(), lse.data<float>(),
      row_losses.data<float>(), out.data<float>(), rows, vocab, detail::stream_of(logits)));
  if (autograd::any_requires_grad({logits})) {
    autograd::record(
        "CrossEntropy", {logits}, {out},
        [in = in.detach(), index, lse, rows, vocab](const std::vector<Tensor>& g,
                                                    const autograd::Node& node) {
          Tensor dloss = g[0].contiguous();
          Tensor dlogits = logits_gradient_buffer(in, node);
          LOOM_IF_CUDA(kernels::cuda::cross_entropy_backward(
              in.dtype(), in.raw_data(), index.data<int64_t>(), lse.data<float>(),
              dloss.data<float>(), dlogits.raw_data(), rows, vocab, detail::stream_of(in)));
          return std::vector<Tensor>{dlogits};
        });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x_in, bool causal) {
  const Tensor x = autocast_f32_input(x_in);
  detail::check_kernel_device("softmax", x);
  if (x.dim() < 1) fail("softmax: expected at least one dimension, got a scalar");
  int64_t width = x.size(-1);
  if (causal && (x.dim() < 2 || x.size(-2) != width)) {
    fail("softmax: a causal softmax needs [..., T, T] scores, got ", shape_str(x.shape()));
  }
  if (width == 0) fail("softmax: the last dimension is empty in ", shape_str(x.shape()));
  int64_t rows = x.numel() / width;
  Tensor in = detail::contiguous_input(x);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (reports_op_cost(x.device())) {
    record_meta_op("softmax", OpClass::Normalization, kSoftmaxFlops * double(x.numel()), {in},
                   {out});
  }
  if (x.device().is_meta()) {
    // nothing to compute: the cost is reported above
  } else if (x.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::softmax_forward(x.dtype(), in.raw_data(), out.raw_data(), rows,
                                                width, causal ? width : 0, detail::stream_of(x)));
  } else {
    detail::dispatch_floating(x.dtype(), "softmax", [&]<typename T>() {
      kernels::cpu::softmax_forward<T>(in.data<T>(), out.data<T>(), rows, width,
                                       causal ? width : 0);
    });
  }
  if (autograd::any_requires_grad({x})) {
    autograd::record(
        "Softmax", {x}, {out},
        [y = out.detach(), rows, width](const std::vector<Tensor>& g, const autograd::Node&) {
          Tensor dy = g[0].contiguous();
          Tensor dx = Tensor::empty(y.shape(), y.dtype(), y.device());
          if (reports_op_cost(y.device())) {
            record_meta_op("Softmax", OpClass::Normalization, kSoftmaxFlops * double(y.numel()),
                           {y, dy}, {dx});
          }
          if (y.device().is_meta()) {
            // nothing to compute: the cost is reported above
          } else if (y.device().is_cuda()) {
            LOOM_IF_CUDA(kernels::cuda::softmax_backward(y.dtype(), y.raw_data(), dy.raw_data(),
                                                         dx.raw_data(), rows, width,
                                                         detail::stream_of(y)));
          } else {
            detail::dispatch_floating(y.dtype(), "softmax", [&]<typename T>() {
              kernels::cpu::softmax_backward<T>(y.data<T>(), dy.data<T>(), dx.data<T>(), rows,
                                                width);
            });
          }
          return std::vector<Tensor>{dx};
        });
  }
  return out;
}

// The loss of 16-bit logits is f32, as in PyTorch's autocast: the kernels, CUDA's and the
// CPU's, read the logits as they are and compute in f32, and the gradient is rounded once to
// the logits' dtype. What backward keeps is the 16-bit logits, not an f32 copy.
namespace {

// cross_entropy of logits that this call alone holds when `handed_over` (Note [The loss's
// gradient with the loss]).
Tensor cross_entropy_of(const Tensor& logits, const Tensor& targets, bool handed_over) {
  detail::check_kernel_device("cross_entropy", logits);
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0)) {
    fail("cross_entropy: expected logits [N, V] and targets [N], got ", shape_str(logits.shape()),
         " and ", shape_str(targets.shape()));
  }
  int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) fail("cross_entropy: no rows; the mean over zero targets is undefined");
  const std::optional<float> announced =
      handed_over && takes_cuda_path(logits.device()) && autograd::any_requires_grad({logits})
          ? LossGradientScope::gradient()
          : std::nullopt;
  if (logits.device().is_cuda()) return cuda_cross_entropy(logits, targets, announced);
  auto index = std::make_shared<std::vector<int64_t>>(
      detail::indices_as_i64("cross_entropy (targets)", targets, vocab));
  Tensor in = detail::contiguous_input(logits);
  // f32 or f64: 16-bit logits have an f32 loss.
  const DType loss_dtype = logits.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor lse = Tensor::empty({rows}, loss_dtype, logits.device());
  Tensor out = Tensor::empty({}, loss_dtype, logits.device());
  if (announced) {  // meta following CUDA: the forward writes the gradient, backward checks
    record_meta_op("cross_entropy", OpClass::Normalization, 2 * kSoftmaxFlops * double(in.numel()),
                   {in, targets}, {lse, out, in});
    autograd::record("CrossEntropy", {logits}, {out},
                     [dlogits = in.detach()](const std::vector<Tensor>& g, const autograd::Node&) {
                       record_meta_op("CrossEntropy", OpClass::Normalization, 0, {g[0]}, {});
                       return std::vector<Tensor>{dlogits};
                     });
    return out;
  }
  if (reports_op_cost(logits.device())) {
    record_meta_op("cross_entropy", OpClass::Normalization, kSoftmaxFlops * double(in.numel()),
                   {in, targets}, {lse, out});
  }
  if (logits.device().is_meta()) {
  } else {
    detail::dispatch_floating_storage(logits.dtype(), "cross_entropy", [&]<typename T>() {
      using C = kernels::cpu::compute_of<T>;
      double loss = kernels::cpu::cross_entropy_forward<T>(in.data<T>(), index->data(),
                                                           lse.data<C>(), rows, vocab);
      *out.data<C>() = static_cast<C>(loss);
    });
  }
  if (autograd::any_requires_grad({logits})) {
    autograd::record("CrossEntropy", {logits}, {out},
                     [in = in.detach(), lse, index, rows, vocab](const std::vector<Tensor>& g,
                                                                 const autograd::Node& node) {
                       Tensor dlogits = logits_gradient_buffer(in, node);
                       if (reports_op_cost(in.device())) {
                         record_meta_op("CrossEntropy", OpClass::Normalization,
                                        kSoftmaxFlops * double(in.numel()), {in, lse}, {dlogits});
                       }
                       if (in.device().is_meta()) return std::vector<Tensor>{dlogits};
                       detail::dispatch_floating_storage(
                           in.dtype(), "cross_entropy", [&]<typename T>() {
                             using C = kernels::cpu::compute_of<T>;
                             // The loss's gradient read in place: item() would allocate a copy.
                             const double scale = static_cast<double>(*g[0].data<C>()) /
                                                  static_cast<double>(rows);
                             kernels::cpu::cross_entropy_backward<T>(
                                 in.data<T>(), index->data(), lse.data<C>(),
                                 static_cast<C>(scale), dlogits.data<T>(), rows, vocab);
                           });
                       return std::vector<Tensor>{dlogits};
                     });
  }
  return out;
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  return cross_entropy_of(logits, targets, /*handed_over=*/false);
}

Tensor cross_entropy(Tensor&& logits, const Tensor& targets) {
  // Checked before anything takes a handle to the logits.
  const bool alone = logits.defined() && logits.holds_storage_alone();
  return cross_entropy_of(logits, targets, alone);
}

namespace {

// The part's logits and targets, checked; targets as i64 on the logits' device.
void check_part(const char* op, const Tensor& logits, const Tensor& targets) {
  detail::check_kernel_device(op, logits);
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0) ||
      logits.size(1) == 0) {
    fail(op, ": expected logits [N, V > 0] and targets [N], got ", shape_str(logits.shape()),
         " and ", shape_str(targets.shape()));
  }
  if (targets.dtype() != DType::I64 && targets.dtype() != DType::I32) {
    fail(op, ": targets must be i32 or i64, got ", targets.dtype());
  }
}

// The row values' dtype: f32, or f64 for f64 logits off CUDA.
DType part_values_dtype(const Tensor& logits) {
  return logits.dtype() == DType::F64 && !logits.device().is_cuda() ? DType::F64 : DType::F32;
}

}  // namespace

std::vector<Tensor> cross_entropy_part(const Tensor& logits, const Tensor& targets,
                                       int64_t first) {
  check_part("cross_entropy_part", logits, targets);
  NoGradGuard no_grad;
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const Tensor in = detail::contiguous_input(logits);
  Tensor lse = Tensor::empty({rows}, part_values_dtype(logits), logits.device());
  Tensor picked = Tensor::empty({rows}, lse.dtype(), logits.device());
  if (reports_op_cost(logits.device())) {
    record_meta_op("cross_entropy_part", OpClass::Normalization,
                   kSoftmaxFlops * double(in.numel()), {in, targets}, {lse, picked});
  }
  if (logits.device().is_cuda()) {
    const Tensor index = targets.to(logits.device()).to(DType::I64).contiguous();
    LOOM_IF_CUDA(kernels::cuda::cross_entropy_part_forward(
        in.dtype(), in.raw_data(), index.data<int64_t>(), first, lse.data<float>(),
        picked.data<float>(), rows, vocab, detail::stream_of(in)));
    return {lse, picked};
  }
  const std::vector<int64_t> index = detail::indices_as_i64(
      "cross_entropy_part (targets)", targets, std::numeric_limits<int64_t>::max());
  if (!logits.device().is_meta()) {
    detail::dispatch_floating_storage(in.dtype(), "cross_entropy_part", [&]<typename T>() {
      using C = kernels::cpu::compute_of<T>;
      kernels::cpu::cross_entropy_part_forward<T>(in.data<T>(), index.data(), first,
                                                  lse.data<C>(), picked.data<C>(), rows, vocab);
    });
  }
  return {lse, picked};
}

Tensor cross_entropy_part_backward(const Tensor& logits, const Tensor& targets, int64_t first,
                                   const Tensor& logsumexp, const Tensor& dloss) {
  check_part("cross_entropy_part_backward", logits, targets);
  NoGradGuard no_grad;
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  const Tensor in = detail::contiguous_input(logits);
  const Tensor lse =
      logsumexp.to(logits.device()).to(part_values_dtype(logits)).contiguous();
  if (lse.shape() != Shape{rows} || dloss.numel() != 1) {
    fail("cross_entropy_part_backward: expected logsumexp [", rows,
         "] and a one-element dloss, got ", shape_str(logsumexp.shape()), " and ",
         shape_str(dloss.shape()));
  }
  // The loss's gradient in the row values' dtype, read on the device (CUDA) or the host.
  const Tensor g = dloss.to(logits.device()).to(lse.dtype()).contiguous();
  Tensor dlogits = Tensor::empty(in.shape(), in.dtype(), in.device());
  if (reports_op_cost(logits.device())) {
    record_meta_op("cross_entropy_part_backward", OpClass::Normalization,
                   kSoftmaxFlops * double(in.numel()), {in, lse}, {dlogits});
  }
  if (logits.device().is_cuda()) {
    const Tensor index = targets.to(logits.device()).to(DType::I64).contiguous();
    LOOM_IF_CUDA(kernels::cuda::cross_entropy_backward(
        in.dtype(), in.raw_data(), index.data<int64_t>(), lse.data<float>(), g.data<float>(),
        dlogits.raw_data(), rows, vocab, detail::stream_of(in), {first, true}));
    return dlogits;
  }
  const std::vector<int64_t> index = detail::indices_as_i64(
      "cross_entropy_part_backward (targets)", targets, std::numeric_limits<int64_t>::max());
  if (!logits.device().is_meta()) {
    detail::dispatch_floating_storage(
        in.dtype(), "cross_entropy_part_backward", [&]<typename T>() {
          using C = kernels::cpu::compute_of<T>;
          const double scale = static_cast<double>(*g.data<C>()) / static_cast<double>(rows);
          kernels::cpu::cross_entropy_backward<T>(in.data<T>(), index.data(), lse.data<C>(),
                                                  static_cast<C>(scale), dlogits.data<T>(), rows,
                                                  vocab, {first, true});
        });
  }
  return dlogits;
}

}  // namespace loom
