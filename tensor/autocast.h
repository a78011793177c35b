#pragma once
// Mixed-precision emulation on the CPU: inside an AutocastGuard(bf16 or f16), matmul and
// linear round their f32 operands and their result to that dtype (through cast, so autograd
// sees the roundings as in PyTorch's autocast). A bf16/f16 GEMM with f32 accumulation computes
// exactly this: products of the rounded inputs are exact in f32, sums are f32. Every other op
// stays in f32. The CPU kernels run in f32, so this reproduces the numerics of bf16-mixed /
// 16-mixed training, not their speed. Thread-local.

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

}  // namespace loom
