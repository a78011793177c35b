#include "strategies/metric_sync.h"

#include "core/error.h"
#include "core/tags.h"
#include "tensor/tensor.h"

namespace loom::strategies {
namespace {

// Mean reduces as Sum and divides by the world size here, so the result is exactly
// sum / size (Lightning's mean), not sum * (1 / size).
comm::ReduceOp reduce_op_of(SyncOp op, int rank) {
  switch (op) {
    case SyncOp::Mean: return comm::ReduceOp::Sum;
    case SyncOp::Sum: return comm::ReduceOp::Sum;
    case SyncOp::Max: return comm::ReduceOp::Max;
    case SyncOp::Min: return comm::ReduceOp::Min;
  }
  tag::kStrategiesMetricSync.fail("rank ", rank, ": unknown SyncOp ", static_cast<int>(op));
}

}  // namespace

std::vector<double> sync_dist(comm::ProcessGroup& group, const std::vector<double>& values,
                              SyncOp op) {
  comm::ReduceOp reduce_op = reduce_op_of(op, group.rank());
  if (values.empty()) return {};
  Tensor buffer = Tensor::from_vector<double>(values, {static_cast<int64_t>(values.size())},
                                              group.device());
  group.allreduce(buffer, {.op = reduce_op, .async_op = false})->wait();
  std::vector<double> result = buffer.to_vector<double>();
  if (op == SyncOp::Mean) {
    for (double& v : result)
      v /= static_cast<double>(group.size());
  }
  return result;
}

double sync_dist(comm::ProcessGroup& group, double value, SyncOp op) {
  return sync_dist(group, std::vector<double>{value}, op).front();
}

}  // namespace loom::strategies
