// Fused causal scaled-dot-product attention.

#include <functional>

#include "kernels/cpu/attention.h"
#include "tensor/autocast.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/attention.h"
#endif

namespace loom {

namespace {

// The FLOPs of causal attention's forward on the meta device: QK^T and PV over the causal
// half (T(T+1)/2 pairs of each head, a multiply-add per head-dim element each).
double causal_attention_flops(const kernels::cpu::AttentionShape& s) {
  const double pairs = double(s.time) * double(s.time + 1) / 2;
  return 2 * 2 * double(s.batch) * double(s.heads) * pairs * double(s.head_dim);
}

// q/k/v-like operand with a contiguous last dimension (copied when it is not).
Tensor with_unit_inner_stride(const Tensor& t) {
  NoGradGuard no_grad;
  return t.strides()[3] == 1 || t.size(3) == 1 ? t : t.contiguous();
}

// An uninitialised [B, H, T, D] tensor stored as [B, T, H, D].
Tensor empty_bthd(const Shape& bhtd, DType dtype, Device device) {
  Tensor storage = Tensor::empty({bhtd[0], bhtd[2], bhtd[1], bhtd[3]}, dtype, device);
  return storage.permute({0, 2, 1, 3});
}

void check_attention_operands(const Tensor& q, const Tensor& k, const Tensor& v) {
  detail::check_kernel_device("causal_attention", q);
  detail::check_same_kind("causal_attention", q, k);
  detail::check_same_kind("causal_attention", q, v);
  const bool ok = q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() &&
                  k.size(0) == q.size(0) && k.size(2) == q.size(2) && k.size(3) == q.size(3) &&
                  k.size(1) > 0 && q.size(1) % k.size(1) == 0;
  if (!ok) {
    fail("causal_attention: expected q [B, H, T, D] and k, v [B, H_kv, T, D] with H_kv dividing "
         "H; got ",
         shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
  }
}

}  // namespace

// Note [One attention for every device]
// Every device runs the flash form: the output and each row's logsumexp are kept, never the
// [B, H, T, T] probabilities (kernels/cpu/attention.h, kernels/cuda/attention.h). Both take
// grouped key/value heads as they are (query head h reads key/value head h / (H / H_kv)) and
// write the key/value gradients summed over each group, so nothing is repeated in memory
// (until 2026-12-06 the CUDA path repeated k and v to the query heads first). The logsumexp
// is f32 on a GPU and the operands' dtype on the CPU (f64 there for the gradient checks).
//
// Note [Attention on the packed projection]
// causal_attention_packed takes GPT-2's fused projection [B, T, 3 H D] as one input, as
// FlashAttention's qkvpacked functions do. Its q, k and v are views of it, and its backward
// writes dq, dk and dv into the three column blocks of one [B, T, 3 H D] gradient. Attending
// to split views instead gives the same bits, but the split's backward then copies the three
// gradients into one (a concat: a launch and a read and write of the whole gradient per
// layer, 2026-12-07).

namespace {

// The gradients the backward writes (dq, dk, dv, in [B, H, T, D] views) and the gradients of
// the op's inputs they make up.
struct AttentionGradients {
  Tensor dq, dk, dv;
  std::vector<Tensor> inputs;
};
using AllocateGradients = std::function<AttentionGradients()>;

// Runs a precision-independent attention `compute` on its inputs as the precision asks:
// under autocast the inputs in the low dtype (PyTorch's autocast runs SDPA on CUDA in it; the
// CPU kernel computes in f32 on values of it) and the result in it; 16-bit inputs on the CPU
// through f32, rounded once.
Tensor at_attention_precision(const std::vector<Tensor>& inputs,
                              const std::function<Tensor(const std::vector<Tensor>&)>& compute) {
  const Tensor& first = inputs.front();
  if (autocast_dtype() != DType::F32) {
    DType low = autocast_dtype();
    AutocastGuard off(DType::F32);
    std::vector<Tensor> low_inputs;
    for (const Tensor& t : inputs) {
      low_inputs.push_back(takes_cuda_path(t.device()) ? autocast_input(t, low)
                                                       : autocast_emulated_input(t, low));
    }
    return autocast_output(compute(low_inputs), low);
  }
  if (detail::computes_through_f32(first)) {
    std::vector<Tensor> wide;
    for (const Tensor& t : inputs)
      wide.push_back(cast(t, DType::F32));
    return cast(compute(wide), first.dtype());
  }
  return compute(inputs);
}

// Attention over q, k, v (views without history of `inputs`, unit inner strides) into a new
// [B, H, T, D] result; when `inputs` need gradients, one node whose backward writes the
// operands' gradients into what `allocate` gives and returns the inputs' gradients.
Tensor attend(const std::vector<Tensor>& inputs, const Tensor& q, const Tensor& k, const Tensor& v,
              AllocateGradients allocate) {
  const bool meta = q.device().is_meta();
  const bool cuda_path = takes_cuda_path(q.device());
  const kernels::cpu::AttentionShape s{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1)};
  Tensor out = empty_bthd(q.shape(), q.dtype(), q.device()).detach();
  Tensor lse = Tensor::empty({s.batch, s.heads, s.time}, cuda_path ? DType::F32 : q.dtype(),
                             q.device());
  if (reports_op_cost(q.device())) {
    record_meta_op("causal_attention", OpClass::Attention, causal_attention_flops(s), {q, k, v},
                   {out, lse}, {s.batch, s.heads, s.time, s.head_dim});
  }
  if (meta || q.numel() == 0) {
    // nothing to compute: the cost is reported above
  } else if (cuda_path) {
    LOOM_IF_CUDA({
      kernels::cuda::AttentionShape cs{s.batch, s.heads, s.time, s.head_dim, s.kv_heads};
      kernels::cuda::flash_attention_forward(
          q.dtype(), cs, q.raw_data(), q.strides().data(), k.raw_data(), k.strides().data(),
          v.raw_data(), v.strides().data(), out.raw_data(), out.strides().data(), lse.data<float>(),
          detail::stream_of(q));
    });
  } else {
    detail::dispatch_floating(q.dtype(), "causal_attention", [&]<typename T>() {
      kernels::cpu::causal_attention_forward<T>(s, q.data<T>(), q.strides().data(), k.data<T>(),
                                                k.strides().data(), v.data<T>(), v.strides().data(),
                                                out.data<T>(), out.strides().data(), lse.data<T>());
    });
  }
  if (autograd::any_requires_grad(inputs)) {
    // The backward keeps `out` detached: the output holds its node, which must not hold it.
    autograd::record(
        "CausalAttention", inputs, {out},
        [qc = q, kc = k, vc = v, o = out.detach(), lse, s, cuda_path,
         allocate = std::move(allocate)](const std::vector<Tensor>& g, const autograd::Node&) {
          Tensor dout = with_unit_inner_stride(g[0]);
          AttentionGradients grads = allocate();
          const Tensor &dq = grads.dq, &dk = grads.dk, &dv = grads.dv;
          // P recomputed from lse, then dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q.
          if (reports_op_cost(qc.device())) {
            record_meta_op("CausalAttention", OpClass::Attention, 2 * causal_attention_flops(s),
                           {dout, qc, kc, vc, o, lse}, {dq, dk, dv},
                           {s.batch, s.heads, s.time, s.head_dim});
          }
          if (qc.device().is_meta() || qc.numel() == 0) {
          } else if (cuda_path) {
            LOOM_IF_CUDA({
              kernels::cuda::AttentionShape cs{s.batch, s.heads, s.time, s.head_dim, s.kv_heads};
              Tensor scratch = detail::workspace(
                  qc.device(), kernels::cuda::flash_attention_backward_workspace(cs));
              kernels::cuda::flash_attention_backward(
                  qc.dtype(), cs, dout.raw_data(), dout.strides().data(), qc.raw_data(),
                  qc.strides().data(), kc.raw_data(), kc.strides().data(), vc.raw_data(),
                  vc.strides().data(), o.raw_data(), o.strides().data(), lse.data<float>(),
                  dq.raw_data(), dq.strides().data(), dk.raw_data(), dk.strides().data(),
                  dv.raw_data(), dv.strides().data(), scratch.raw_data(), detail::stream_of(qc));
            });
          } else {
            detail::dispatch_floating(qc.dtype(), "causal_attention", [&]<typename T>() {
              kernels::cpu::causal_attention_backward<T>(
                  s, dout.data<T>(), dout.strides().data(), qc.data<T>(), qc.strides().data(),
                  kc.data<T>(), kc.strides().data(), vc.data<T>(), vc.strides().data(),
                  o.data<T>(), o.strides().data(), lse.data<T>(), dq.data<T>(),
                  dq.strides().data(), dk.data<T>(), dk.strides().data(), dv.data<T>(),
                  dv.strides().data());
            });
          }
          return grads.inputs;
        });
  }
  return out;
}

// The H * D columns from `first` of a packed x [B, T, 3 H D], as a [B, H, T, D] view.
Tensor heads_of(const Tensor& x, int64_t first, int64_t heads) {
  const int64_t batch = x.size(0), time = x.size(1), width = x.size(2) / 3;
  return x.narrow(2, first, width)
      .reshape({batch, time, heads, width / heads})
      .permute({0, 2, 1, 3});
}

}  // namespace

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  return at_attention_precision({q, k, v}, [](const std::vector<Tensor>& in) {
    check_attention_operands(in[0], in[1], in[2]);
    Tensor qc = with_unit_inner_stride(in[0]).detach(), kc = with_unit_inner_stride(in[1]).detach(),
           vc = with_unit_inner_stride(in[2]).detach();
    return attend(in, qc, kc, vc, [qc, kc, vc] {
      Tensor dq = empty_bthd(qc.shape(), qc.dtype(), qc.device());
      Tensor dk = empty_bthd(kc.shape(), kc.dtype(), kc.device());
      Tensor dv = empty_bthd(vc.shape(), vc.dtype(), vc.device());
      return AttentionGradients{dq, dk, dv, {dq, dk, dv}};
    });
  });
}

Tensor causal_attention_packed(const Tensor& qkv, int64_t heads) {
  detail::check_kernel_device("causal_attention_packed", qkv);
  if (qkv.dim() != 3 || heads < 1 || qkv.size(2) % (3 * heads) != 0 || qkv.size(2) == 0) {
    fail(
        "causal_attention_packed: expected qkv [B, T, 3 H D] (q, k, v's heads side by side) "
        "and heads H >= 1 dividing a third of its last dimension; got ",
        shape_str(qkv.shape()), " and ", heads, " heads");
  }
  const int64_t batch = qkv.size(0), time = qkv.size(1), width = qkv.size(2) / 3;
  Tensor y = at_attention_precision({qkv}, [heads, width](const std::vector<Tensor>& in) {
    Tensor packed = in[0].detach();
    if (packed.strides()[2] != 1) {
      NoGradGuard no_grad;
      packed = packed.contiguous();
    }
    Tensor q = heads_of(packed, 0, heads), k = heads_of(packed, width, heads),
           v = heads_of(packed, 2 * width, heads);
    return attend(
        in, q, k, v,
        [shape = packed.shape(), dtype = packed.dtype(), device = packed.device(), heads, width] {
          Tensor dqkv = Tensor::empty(shape, dtype, device);
          return AttentionGradients{heads_of(dqkv, 0, heads),
                                    heads_of(dqkv, width, heads),
                                    heads_of(dqkv, 2 * width, heads),
                                    {dqkv}};
        });
  });
  return y.permute({0, 2, 1, 3}).reshape({batch, time, width});
}

}  // namespace loom
