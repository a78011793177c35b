#pragma once
// Reduction operators of collectives, and their mapping onto the reduction kernels.

#include <string_view>

#include "core/dtype.h"
#include "kernels/cpu/reduce_ops.h"

namespace loom::comm {

// Avg is Sum divided by the group size (floating dtypes only, as NCCL's ncclAvg).
enum class ReduceOp { Sum, Avg, Min, Max, Prod };

std::string_view reduce_op_name(ReduceOp op);  // "sum", "avg", ...

kernels::cpu::ReduceKind reduce_kind_of(ReduceOp op);  // Avg reduces as Sum, then scales

}  // namespace loom::comm
