#include "tensor/ops/dispatch.h"

#include "tensor/meta.h"
#include "tensor/ops.h"

namespace loom::detail {

void check_kernel_device(const char* op, const Tensor& t) {
  check(t.defined(), std::string(op) + ": got an undefined tensor");
  if (t.device().is_cuda() && !LOOM_WITH_CUDA) {
    fail(op, ": no kernel for ", t.device(),
         " in this build; configure with -DLOOM_WITH_CUDA=ON on a machine with the CUDA toolkit");
  }
}

void check_same_kind(const char* op, const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype()) {
    fail(op, ": operands have different dtypes (", a.dtype(), " vs ", b.dtype(),
         "); cast one with .to()");
  }
  if (a.device() != b.device()) {
    fail(op, ": operands are on different devices (", a.device(), " vs ", b.device(), ")");
  }
}

bool computes_through_f32(const Tensor& x) {
  // Meta following the CPU's path does the same, so that it allocates what the CPU does.
  return !takes_cuda_path(x.device()) && is_16bit_float(x.dtype());
}

Tensor widened(const Tensor& x) {
  NoGradGuard no_grad;
  return cast(x, DType::F32);
}

DType promoted_dtype(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::F64 || b == DType::F64) return DType::F64;
  return DType::F32;
}

Tensor contiguous_input(const Tensor& x) {
  NoGradGuard no_grad;
  return x.contiguous();
}

std::vector<int64_t> indices_as_i64(const char* op, const Tensor& indices, int64_t upper) {
  std::vector<int64_t> values;
  if (indices.dtype() == DType::I64) {
    values = indices.to_vector<int64_t>();
  } else if (indices.dtype() == DType::I32) {
    std::vector<int32_t> narrow = indices.to_vector<int32_t>();
    values.assign(narrow.begin(), narrow.end());
  } else {
    fail(op, ": indices must be i32 or i64, got ", indices.dtype());
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] >= upper) {
      fail(op, ": index ", values[i], " at position ", i, " is out of range [0, ", upper, ")");
    }
  }
  return values;
}

}  // namespace loom::detail
