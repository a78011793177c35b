#include "strategies/pipeline/schedule.h"

#include <algorithm>

#include "tensor/error.h"

namespace loom::strategies::pipeline {

double Schedule::theoretical_bubble(int stages, int micro_batches) const {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

std::vector<Action> GPipeSchedule::actions(int, int, int micro_batches) const {
  std::vector<Action> out;
  for (int k = 0; k < micro_batches; ++k)
    out.push_back({Action::Forward, k});
  for (int k = 0; k < micro_batches; ++k)
    out.push_back({Action::Backward, k});
  return out;
}

std::vector<Action> OneFOneBSchedule::actions(int stage, int stages, int micro_batches) const {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k)
    out.push_back({Action::Forward, k});
  for (int k = 0; k + warmup < micro_batches; ++k) {
    out.push_back({Action::Forward, k + warmup});
    out.push_back({Action::Backward, k});
  }
  for (int k = micro_batches - warmup; k < micro_batches; ++k)
    out.push_back({Action::Backward, k});
  return out;
}

std::unique_ptr<Schedule> make_schedule(const std::string& name) {
  if (name == "gpipe") return std::make_unique<GPipeSchedule>();
  if (name == "1f1b") return std::make_unique<OneFOneBSchedule>();
  fail("[pipeline] unknown schedule '", name, "'; expected gpipe or 1f1b");
}

void check_actions(const std::vector<Action>& actions, int micro_batches,
                   const std::string& schedule) {
  std::vector<int> forwards(static_cast<size_t>(micro_batches), 0);
  int next_backward = 0;
  for (const Action& a : actions) {
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches)
      fail("[pipeline] schedule ", schedule, ": micro-batch ", a.micro_batch, " of ", micro_batches);
    if (a.kind == Action::Forward) {
      if (forwards[a.micro_batch]++ != 0)
        fail("[pipeline] schedule ", schedule, ": micro-batch ", a.micro_batch, " runs forward twice");
      continue;
    }
    if (a.micro_batch != next_backward) {
      fail("[pipeline] schedule ", schedule, ": backward of micro-batch ", a.micro_batch,
           " where ", next_backward, " is due (backward passes run in increasing order)");
    }
    if (forwards[a.micro_batch] == 0)
      fail("[pipeline] schedule ", schedule, ": backward of micro-batch ", a.micro_batch, " before its forward");
    ++next_backward;
  }
  if (next_backward != micro_batches)
    fail("[pipeline] schedule ", schedule, ": ", next_backward, " backward passes for ", micro_batches,
         " micro-batches");
}

int peak_in_flight(const std::vector<Action>& actions) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    held += a.kind == Action::Forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

}  // namespace loom::strategies::pipeline
