// The classifier and its loss in one op: logits x @ weight^T, their softmax cross-entropy, and
// the gradients of both, a chunk of rows at a time.

#include <cmath>
#include <memory>

#include "kernels/cpu/softmax.h"
#include "tensor/autocast.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/dispatch.h"

namespace loom {

// Note [The classifier without its logits]
// A language model's last product makes [tokens, vocab] logits: 206 MB in f32 for GPT-2
// small's 1,024 tokens of a 50,304-word vocabulary, 1.6 GB for 8,192 tokens, more than all of
// its other activations of a block together. Only their loss and two gradients are wanted, so
// linear_cross_entropy computes them a chunk of rows at a time: the chunk's logits (one GEMM
// into one reused buffer), each row's logsumexp and loss, then, when gradients are needed,
// the chunk's dlogits in place of its logits and from them its rows of dx (dlogits @ weight)
// and its share of dweight (dlogits^T @ x, summed over the chunks in order). So the forward
// computes the gradients, as Liger-Kernel's fused linear cross-entropy does, and keeps dx
// [N, C] and dweight [V, C] for backward, which scales them by the loss's gradient in place
// (nothing when it is 1, as it is for a plain loss.backward()). No [N, V] tensor is ever
// held, the products are the three the two ops make, and the memory passes over the logits
// are those of one chunk, in cache far more than a whole [N, V].
//
// The loss and gradients are those of cross_entropy(matmul(x, weight^T)) up to the order of
// sums: dweight's sum over rows runs chunk by chunk. The chunks' size depends on the shape
// only, so the result is bitwise the same on any thread count. CUDA (and meta following it),
// autocast and 16-bit operands compose the two ops, holding the logits; they hand them over to
// cross_entropy, which on CUDA then writes their gradient over them in its forward where the
// loss's gradient is announced (Note [The loss's gradient with the loss] in softmax.cpp).

namespace {

// At most about kChunkElements logits per chunk (64 MB in f32), in chunks of equal rows, at
// least kMinChunkRows of them: each chunk's products read the whole weight and add into the
// whole dweight, so smaller chunks cost time. GPT-2 small's vocabulary at 1,024 rows, one
// thread (bench_classifier, 2026-12-04): chunks of 64 rows 9% slower than the composed ops,
// 128 1% slower, 256 2% faster (within this host's noise of about 5%).
constexpr int64_t kChunkElements = int64_t{1} << 24;
constexpr int64_t kMinChunkRows = 256;

int64_t chunk_rows_for(int64_t rows, int64_t vocab) {
  const int64_t most = std::max(kMinChunkRows, kChunkElements / std::max<int64_t>(vocab, 1));
  const int64_t chunks = (rows + most - 1) / most;
  return (rows + chunks - 1) / chunks;
}

// Whether the chunked form runs (outside autocast): f32/f64 operands on the CPU, or on meta
// following the CPU's path.
bool runs_in_chunks(const Tensor& x) {
  return !takes_cuda_path(x.device()) && (x.dtype() == DType::F32 || x.dtype() == DType::F64);
}

// FLOPs per logit of the softmax cross-entropy, as cross_entropy counts them.
constexpr double kSoftmaxFlops = 4;

// The gradients the forward computed, until backward hands them on.
struct SavedGradients {
  Tensor dx, dweight;
};

}  // namespace

Tensor detail::linear_cross_entropy_in_chunks(const Tensor& x, const Tensor& weight,
                                              const Tensor& targets, int64_t chunk_rows) {
  const int64_t rows = x.size(0), width = x.size(1), vocab = weight.size(0);
  const std::vector<int64_t> index =
      indices_as_i64("linear_cross_entropy (targets)", targets, vocab);
  const bool grad_x = grad_mode_enabled() && x.requires_grad();
  const bool grad_weight = grad_mode_enabled() && weight.requires_grad();
  const bool gradients = grad_x || grad_weight;
  const Device device = x.device();
  const DType dtype = x.dtype();
  const Tensor w = weight.detach(), xs = x.detach();
  const Tensor w_t = transpose(w, 0, 1);  // [C, V], a view
  auto saved = std::make_shared<SavedGradients>();
  if (grad_x) saved->dx = Tensor::empty({rows, width}, dtype, device);
  if (grad_weight) saved->dweight = Tensor::empty({vocab, width}, dtype, device);
  Tensor buffer = Tensor::empty({chunk_rows, vocab}, dtype, device);
  Tensor lse_buffer = Tensor::empty({chunk_rows}, dtype, device);
  Tensor out = Tensor::empty({}, dtype, device);
  double total = 0;  // the rows' losses in row order, as cross_entropy sums them
  for (int64_t first = 0; first < rows; first += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - first);
    const Tensor x_rows = xs.narrow(0, first, count);
    Tensor logits = buffer.narrow(0, 0, count);
    Tensor lse = lse_buffer.narrow(0, 0, count);
    matmul_into(x_rows, w_t, logits, false);
    if (reports_op_cost(device)) {
      record_meta_op("cross_entropy", OpClass::Normalization,
                     kSoftmaxFlops * double(logits.numel()), {logits}, {lse});
    }
    if (gradients && reports_op_cost(device)) {
      record_meta_op("CrossEntropy", OpClass::Normalization,
                     kSoftmaxFlops * double(logits.numel()), {logits, lse}, {logits});
    }
    if (!device.is_meta()) {
      dispatch_floating(dtype, "linear_cross_entropy", [&]<typename T>() {
        const int64_t* target = index.data() + first;
        T* z = logits.data<T>();
        kernels::cpu::cross_entropy_forward<T>(z, target, lse.data<T>(), count, vocab);
        for (int64_t r = 0; r < count; ++r)
          total += static_cast<double>(lse.data<T>()[r] - z[r * vocab + target[r]]);
        if (gradients) {  // the logits become their gradient, in place
          const auto scale = static_cast<T>(1.0 / static_cast<double>(rows));
          kernels::cpu::cross_entropy_backward<T>(z, target, lse.data<T>(), scale, z, count,
                                                  vocab);
        }
      });
    }
    if (grad_x) {
      Tensor dx_rows = saved->dx.narrow(0, first, count);
      matmul_into(logits, w, dx_rows, false);
    }
    if (grad_weight)
      matmul_into(transpose(logits, 0, 1), x_rows, saved->dweight, /*accumulate=*/first > 0);
  }
  if (!device.is_meta()) {
    dispatch_floating(dtype, "linear_cross_entropy", [&]<typename T>() {
      *out.data<T>() = static_cast<T>(total / static_cast<double>(rows));
    });
  }
  if (gradients) {
    autograd::record(
        "LinearCrossEntropy", {x, weight}, {out},
        [saved](const std::vector<Tensor>& g, const autograd::Node& node) {
          SavedGradients grads = *saved;
          if (node.last_use()) {
            *saved = {};  // backward owns them now
          } else {        // another backward will read them again (retain_graph)
            if (grads.dx.defined()) grads.dx = grads.dx.clone();
            if (grads.dweight.defined()) grads.dweight = grads.dweight.clone();
          }
          const Tensor& dloss = g[0];
          if (!dloss.device().is_meta()) {
            // Read in place: item() would allocate a copy, which meta's step would not.
            const double factor = detail::dispatch_floating(
                dloss.dtype(), "linear_cross_entropy",
                [&]<typename T>() { return static_cast<double>(*dloss.data<T>()); });
            for (Tensor* t : {&grads.dx, &grads.dweight})
              if (t->defined() && factor != 1.0) mul_(*t, factor);
          }
          return std::vector<Tensor>{node.needs_input_grad(0) ? grads.dx : Tensor(),
                                     node.needs_input_grad(1) ? grads.dweight : Tensor()};
        });
  }
  return out;
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets) {
  // Autocast's product takes operands of two dtypes (its own casts): compose there.
  if (autocast_dtype() != DType::F32)
    return cross_entropy(matmul(x, transpose(weight, 0, 1)), targets);
  detail::check_kernel_device("linear_cross_entropy", x);
  detail::check_same_kind("linear_cross_entropy", x, weight);
  if (x.dim() != 2 || weight.dim() != 2 || targets.dim() != 1 || x.size(1) != weight.size(1) ||
      targets.size(0) != x.size(0)) {
    fail("linear_cross_entropy: expected x [N, C], weight [V, C] and targets [N], got ",
         shape_str(x.shape()), ", ", shape_str(weight.shape()), " and ",
         shape_str(targets.shape()));
  }
  if (x.size(0) == 0)
    fail("linear_cross_entropy: no rows; the mean over zero targets is undefined");
  if (!runs_in_chunks(x)) return cross_entropy(matmul(x, transpose(weight, 0, 1)), targets);
  return detail::linear_cross_entropy_in_chunks(x, weight, targets,
                                                chunk_rows_for(x.size(0), weight.size(0)));
}

}  // namespace loom
