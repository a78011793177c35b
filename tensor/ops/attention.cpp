// Fused causal scaled-dot-product attention.

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
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (autocast_dtype() != DType::F32) {  // as PyTorch's autocast does for SDPA on CUDA
    DType low = autocast_dtype();
    AutocastGuard off(DType::F32);
    // The CPU kernel computes in f32 or f64: the low dtype is emulated there (autocast.h).
    const auto input = [&](const Tensor& t) {
      return takes_cuda_path(t.device()) ? autocast_input(t, low) : autocast_emulated_input(t, low);
    };
    return autocast_output(causal_attention(input(q), input(k), input(v)), low);
  }
  check_attention_operands(q, k, v);
  if (detail::computes_through_f32(q)) {  // 16-bit operands on the CPU: f32, rounded once
    const DType low = q.dtype();
    return cast(causal_attention(cast(q, DType::F32), cast(k, DType::F32), cast(v, DType::F32)),
                low);
  }
  const bool meta = q.device().is_meta();
  const bool cuda_path = takes_cuda_path(q.device());
  const kernels::cpu::AttentionShape s{q.size(0), q.size(1), q.size(2), q.size(3), k.size(1)};
  Tensor qc = with_unit_inner_stride(q), kc = with_unit_inner_stride(k),
         vc = with_unit_inner_stride(v);
  Tensor out = empty_bthd(q.shape(), q.dtype(), q.device()).detach();
  Tensor lse = Tensor::empty({s.batch, s.heads, s.time}, cuda_path ? DType::F32 : q.dtype(),
                             q.device());
  if (reports_op_cost(q.device())) {
    record_meta_op("causal_attention", OpClass::Attention, causal_attention_flops(s), {qc, kc, vc},
                   {out, lse}, {s.batch, s.heads, s.time, s.head_dim});
  }
  if (meta || q.numel() == 0) {
    // nothing to compute: the cost is reported above
  } else if (cuda_path) {
    LOOM_IF_CUDA({
      kernels::cuda::AttentionShape cs{s.batch, s.heads, s.time, s.head_dim, s.kv_heads};
      kernels::cuda::flash_attention_forward(
          q.dtype(), cs, qc.raw_data(), qc.strides().data(), kc.raw_data(), kc.strides().data(),
          vc.raw_data(), vc.strides().data(), out.raw_data(), out.strides().data(),
          lse.data<float>(), detail::stream_of(q));
    });
  } else {
    detail::dispatch_floating(q.dtype(), "causal_attention", [&]<typename T>() {
      kernels::cpu::causal_attention_forward<T>(
          s, qc.data<T>(), qc.strides().data(), kc.data<T>(), kc.strides().data(), vc.data<T>(),
          vc.strides().data(), out.data<T>(), out.strides().data(), lse.data<T>());
    });
  }
  if (autograd::any_requires_grad({q, k, v})) {
    autograd::record(
        "CausalAttention", {q, k, v}, {out},
        [qc = qc.detach(), kc = kc.detach(), vc = vc.detach(), o = out.detach(), lse, s,
         cuda_path](const std::vector<Tensor>& g, const autograd::Node&) {
          Tensor dout = with_unit_inner_stride(g[0]);
          Tensor dq = empty_bthd(qc.shape(), qc.dtype(), qc.device());
          Tensor dk = empty_bthd(kc.shape(), kc.dtype(), kc.device());
          Tensor dv = empty_bthd(vc.shape(), vc.dtype(), vc.device());
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
          return std::vector<Tensor>{dq, dk, dv};
        });
  }
  return out;
}

}  // namespace loom
