#pragma once
// Mixed precision, with PyTorch's autocast as the reference: inside an AutocastGuard(bf16 or
// f16), matmul, linear and causal_attention take their f32 operands in that dtype and give
// their result in it (PyTorch's lower-precision list); layer_norm, rms_norm and softmax take a
// bf16/f16 input in f32 (its f32 list), and cross_entropy gives the f32 loss of 16-bit logits
// (reading them as they are on CUDA: ops.h); every other op runs in the dtype
// it is given, a binary op of f32 and bf16 in f32 (promotion, ops.h). So a matmul's bf16
// result feeds GELU and the next matmul as it is, and is widened only where it meets the f32
// residual stream or a normalisation. The casts go through cast(), so autograd rounds the
// activations' gradients as PyTorch's autocast does; the gradients of the weights it casts
// from f32 come out of their products in f32, unrounded, where PyTorch rounds them to 16 bits
// (Note [Weight gradients in f32] in autocast.cpp). Thread-local.
//  - CUDA: the three ops really run in bf16/f16 (cuBLASLt or the flash-attention kernels,
//    f32 accumulation).
//  - CPU, bf16: matmul and linear run on bf16 tensors (kernels/cpu/gemm.h's gemm_bf16: oneDNN
//    on AMX or AVX512_BF16 where the CPU has them, else widened to f32, the same numbers up to
//    the order of the sums); their gradients are bf16 products too, as on CUDA. Attention is
//    emulated (below). Other ops given bf16 compute through f32 copies and round their result
//    once (dispatch.h's computes_through_f32), the arithmetic of CUDA's kernels.
//  - CPU, f16, and attention in either: emulated. Operands are rounded through the low dtype
//    and the kernel runs in f32 on them, which computes the same thing up to the rounding of
//    intermediates (products of the rounded inputs are exact in f32, sums are f32; attention's
//    probabilities stay f32); the result is rounded to the low dtype: the numerics of
//    16-mixed, not its speed.
//  - meta: as the CPU, or as CUDA under a MetaCudaPathScope.

#include <memory>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype);  // F32 turns autocast off inside the scope
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType previous_;
};

// The active autocast dtype (F32 when off).
DType autocast_dtype();

// What a step's WeightCastScope cast, kept by the caller for the next step's scope: given
// one, a scope casts every weight view the previous step cast in one launch at its first
// cast (kernels::cuda::multi_tensor_cast; the CPU casts them one after another), instead of
// one launch per weight as each is first used. Views whose parameter is no longer in the
// scope, or that are neither contiguous nor a transposed contiguous matrix, are cast at
// first use as before. Holds no memory of the parameters (their storages weakly).
class WeightCastPlan {
 public:
  // Weight views cast by the last scope that kept its casts here.
  size_t size() const { return views_.size(); }

 private:
  friend class WeightCastScope;
  struct View {
    std::weak_ptr<Storage> storage;
    int64_t offset;
    Shape shape, strides;
    DType dtype;
  };
  std::vector<View> views_;
};

// Autocast's weight cache, over a scope the caller chooses (Note [Autocast's weight cache] in
// autocast.cpp). Inside it, on this thread, autocast casts each of `parameters` (or a view of
// one, such as a transposed weight) to the low dtype once and reuses that cast for every later
// use: in the forward, in activation checkpointing's recomputation and in the next
// micro-batches. The values are the same as casting each time, and so are the gradients (each
// use records its own cast node). The caller promises that the parameters' values do not change
// inside the scope: a step's micro-batches, ended before the optimizer step. The cast weights
// stay allocated until the scope ends (2 bytes per cached parameter element). Only where
// autocast casts (CUDA; bf16 on the CPU), not where it rounds through the low dtype. With a
// `plan`, the scope casts what the plan holds at its first cast and leaves in the plan what
// it cast, for the next step's scope. Scopes nest; the innermost is the one in effect.
class WeightCastScope {
 public:
  explicit WeightCastScope(const std::vector<Tensor>& parameters, WeightCastPlan* plan = nullptr);
  ~WeightCastScope();
  WeightCastScope(const WeightCastScope&) = delete;
  WeightCastScope& operator=(const WeightCastScope&) = delete;
  // Casts made so far (each a distinct parameter view and dtype).
  size_t cached_casts() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
  State* previous_;
};
// x rounded through `dtype` (cast there and back, recorded by autograd) when x is f32; x
// otherwise.
Tensor round_through(const Tensor& x, DType dtype);
// An f32 operand of matmul or linear under autocast: cast to `low` where the op computes in it
// (CUDA; bf16 on the CPU), else rounded through it; an operand already in `low` as it is (or
// widened exactly where the op cannot compute in it).
Tensor autocast_input(const Tensor& x, DType low);
// An operand of an op that computes in f32 on values of `low`, as the CPU's attention: an f32
// x rounded through `low`, a low-precision x widened (exactly).
Tensor autocast_emulated_input(const Tensor& x, DType low);
// The result of a lower-precision op: in `low` (cast when the op computed in f32).
Tensor autocast_output(const Tensor& y, DType low);
// The input of an op autocast runs in f32 (layer_norm, rms_norm, softmax; the tensor-parallel
// cross-entropy): a bf16/f16 x cast to f32 while autocast is on; x otherwise.
Tensor autocast_f32_input(const Tensor& x);

}  // namespace loom
