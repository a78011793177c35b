#include "strategies/model_averaging.h"

#include "core/tags.h"

namespace loom::strategies {

PeriodicModelAverager::PeriodicModelAverager(int period, int warmup_steps)
    : period_(period), warmup_steps_(warmup_steps) {
  if (period < 1) tag::kModelAveraging.fail("period must be at least 1, got ", period);
  if (warmup_steps < 0)
    tag::kModelAveraging.fail("warmup_steps must be at least 0, got ", warmup_steps);
}

void PeriodicModelAverager::average_parameters(const std::vector<Tensor>& params,
                                               comm::ProcessGroup& group) {
  if (averages_at(step_)) {
    // One allreduce per parameter, all in flight before the first wait.
    std::vector<comm::WorkPtr> works;
    works.reserve(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].is_contiguous())
        tag::kModelAveraging.fail("rank ", group.rank(), ": parameter ", i,
                                  " is not contiguous; expected contiguous parameters");
      Tensor p = params[i];
      works.push_back(group.allreduce(p, {.op = comm::ReduceOp::Avg}));
    }
    for (auto& work : works)
      work->wait();
  }
  ++step_;
}

}  // namespace loom::strategies
