#include "tensor/autocast.h"

#include "tensor/meta.h"
#include "tensor/ops.h"

namespace loom {

namespace {
thread_local DType active = DType::F32;
}  // namespace

AutocastGuard::AutocastGuard(DType dtype) : previous_(active) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) {
    fail("AutocastGuard: expected bf16, f16 or f32, got ", dtype);
  }
  active = dtype;
}

AutocastGuard::~AutocastGuard() {
  active = previous_;
}

DType autocast_dtype() {
  return active;
}

Tensor round_through(const Tensor& x, DType dtype) {
  if (dtype == DType::F32 || !x.defined() || x.dtype() != DType::F32) return x;
  return cast(cast(x, dtype), DType::F32);
}

Tensor autocast_input(const Tensor& x, DType low) {
  if (!x.defined() || x.dtype() != DType::F32) return x;
  const bool computes_in_low = takes_cuda_path(x.device()) || low == DType::BF16;
  return computes_in_low ? cast(x, low) : round_through(x, low);
}

Tensor autocast_output(const Tensor& y, DType low) {
  return y.dtype() == low ? cast(y, DType::F32) : round_through(y, low);
}

}  // namespace loom
