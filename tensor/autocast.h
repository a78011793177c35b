#pragma once
// Mixed precision: inside an AutocastGuard(bf16 or f16), matmul, linear and causal_attention
// take their f32 operands in that dtype and give an f32 result rounded to it (through cast,
// so autograd sees the roundings as in PyTorch's autocast, which also runs these three in
// the low dtype on CUDA). Every other op stays in f32. Thread-local.
//  - CUDA: the op really runs in bf16/f16 (cuBLASLt or the flash-attention kernels, f32
//    accumulation) and its result is cast back to f32.
//  - CPU, bf16: matmul and linear run on bf16 tensors (kernels/cpu/gemm.h's gemm_bf16: oneDNN
//    on AMX or AVX512_BF16 where the CPU has them, else widened to f32, the same numbers up to
//    the order of the sums), their results rounded to bf16 and cast back to f32; their
//    gradients are bf16 products too, as on CUDA. Attention is emulated (below).
//  - CPU, f16, and attention in either: emulated. Operands and result are rounded through
//    the low dtype and the kernel runs in f32, which computes the same thing up to the
//    rounding of intermediates (products of the rounded inputs are exact in f32, sums are
//    f32; attention's probabilities stay f32): the numerics of 16-mixed, not its speed.
//  - meta: as the CPU, or as CUDA under a MetaCudaPathScope.

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
// x rounded through `dtype` (cast there and back, recorded by autograd) when x is f32; x
// otherwise.
Tensor round_through(const Tensor& x, DType dtype);
// An f32 operand of matmul or linear under autocast: cast to `low` where the op computes in it
// (CUDA; bf16 on the CPU), else rounded through it.
Tensor autocast_input(const Tensor& x, DType low);
// The result of an autocast op back in f32: cast up when it was computed in `low`, rounded
// through `low` when it was computed in f32 (the CPU emulation).
Tensor autocast_output(const Tensor& y, DType low);

}  // namespace loom
