#include "comm/reduce_op.h"

namespace loom::comm {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Prod: return "prod";
  }
  return "invalid";
}

kernels::cpu::ReduceType reduce_type_of(DType dtype) {
  using kernels::cpu::ReduceType;
  switch (dtype) {
    case DType::F32: return ReduceType::F32;
    case DType::F64: return ReduceType::F64;
    case DType::BF16: return ReduceType::BF16;
    case DType::F16: return ReduceType::F16;
    case DType::I32: return ReduceType::I32;
    case DType::I64: return ReduceType::I64;
    case DType::U8: return ReduceType::U8;
  }
  return ReduceType::F32;
}

kernels::cpu::ReduceKind reduce_kind_of(ReduceOp op) {
  using kernels::cpu::ReduceKind;
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return ReduceKind::Sum;
    case ReduceOp::Min: return ReduceKind::Min;
    case ReduceOp::Max: return ReduceKind::Max;
    case ReduceOp::Prod: return ReduceKind::Prod;
  }
  return ReduceKind::Sum;
}

}  // namespace loom::comm
