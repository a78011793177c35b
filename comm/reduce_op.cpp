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
