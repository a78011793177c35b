#pragma once
// Options of the DDP strategies (strategies/ddp/ddp_strategy.h): the reducer's (bucket sizes,
// communication hook, unused parameters) and local SGD's.

#include "strategies/ddp/reducer.h"

namespace loom::strategies {

struct DDPOptions : ReducerOptions {
  // Local SGD with periodic model averaging. 0 = off. With local_sgd_period = k > 0, the
  // first local_sgd_warmup optimizer steps are plain DDP (gradients averaged every backward);
  // after them gradients are never synchronised (whatever set_backward_sync says) and
  // optimizer_step() averages the parameters after every k-th step, starting with step index
  // local_sgd_warmup (strategies/model_averaging.h). Optimizer state (momentum, Adam moments)
  // stays local.
  int local_sgd_period = 0;
  int local_sgd_warmup = 0;
};

}  // namespace loom::strategies
