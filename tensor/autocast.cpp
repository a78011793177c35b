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

Tensor autocast_emulated_input(const Tensor& x, DType low) {
  if (!x.defined()) return x;
  if (x.dtype() == low) return cast(x, DType::F32);
  return round_through(x, low);
}

Tensor autocast_input(const Tensor& x, DType low) {
  if (!x.defined() || (x.dtype() != DType::F32 && x.dtype() != low)) return x;
  const bool computes_in_low = takes_cuda_path(x.device()) || low == DType::BF16;
  if (!computes_in_low) return autocast_emulated_input(x, low);
  return x.dtype() == low ? x : cast(x, low);
}

Tensor autocast_output(const Tensor& y, DType low) {
  return y.dtype() == low ? y : cast(y, low);
}

Tensor autocast_f32_input(const Tensor& x) {
  if (active == DType::F32 || !x.defined() || !is_16bit_float(x.dtype()))
    return x;
  return cast(x, DType::F32);
}

}  // namespace loom
