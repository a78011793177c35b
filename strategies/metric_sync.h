#pragma once
// Synchronising logged metrics across ranks (Lightning's self.log(..., sync_dist=True,
// reduce_fx=...)): every rank passes its local value and gets the reduction over the group.
//
//   double loss = sync_dist(*pg, local_loss, SyncOp::Mean);
//   std::vector<double> means = sync_dist(*pg, {local_loss, local_acc}, SyncOp::Mean);
//
// Collective and blocking: every rank of the group must call it in the same order with the
// same op (and, for the vector overload, the same number of values). Values are reduced in
// f64. Errors of the group surface as loom::CommError, as from ProcessGroup::allreduce.

#include <vector>

#include "comm/process_group.h"

namespace loom::strategies {

enum class SyncOp {
  Mean,  // sum over ranks / world size
  Sum,
  Max,
  Min,
};

// The reduction of `value` over every rank of `group`.
double sync_dist(comm::ProcessGroup& group, double value, SyncOp op);

// Element-wise reduction of `values` over every rank, in one allreduce. An empty vector
// returns at once without communicating (on every rank, since the sizes must agree).
std::vector<double> sync_dist(comm::ProcessGroup& group, const std::vector<double>& values,
                              SyncOp op);

}  // namespace loom::strategies
