#include "tools/train_gpt/graphed_step.h"

#include "core/tags.h"
#include "tensor/ops.h"

#if LOOM_WITH_CUDA
#include "tensor/cuda/graph.h"
#endif

namespace loom::train_gpt {

#if LOOM_WITH_CUDA
struct GraphedStep::Graph : cuda::Graph {
  using cuda::Graph::Graph;
};
#else
struct GraphedStep::Graph {};
#endif

GraphedStep::GraphedStep(Device device) : device_(device) {
  if (!LOOM_WITH_CUDA) {
    tag::kTrainGpt.fail("--cuda-graph: this build has no CUDA (configure with LOOM_WITH_CUDA=ON)");
  }
  if (!device_.is_cuda()) {
    tag::kTrainGpt.fail("--cuda-graph captures CUDA work, but the step runs on ", device_.str(),
                        "; add --device cuda");
  }
#if LOOM_WITH_CUDA
  graph_ = std::make_unique<Graph>(device_.index);
#endif
}

GraphedStep::~GraphedStep() = default;

data::Batch GraphedStep::stage(const data::Batch& batch) {
  if (!staged_.tokens.defined()) {
    staged_ = {batch.tokens.to(device_), batch.targets.to(device_)};
    return staged_;
  }
  copy_(staged_.tokens, batch.tokens);
  copy_(staged_.targets, batch.targets);
  return staged_;
}

GraphedStep::Outputs GraphedStep::run(const std::function<Outputs()>& step,
                                      const std::function<void()>& before_replay) {
  ++calls_;
  if (calls_ == 1) return step();  // warm-up: plans, optimizer state, cast plan
#if LOOM_WITH_CUDA
  if (calls_ == 2)
    graph_->capture([&] { outputs_ = step(); });
  else
    before_replay();
  graph_->replay();
#else
  (void)before_replay;  // unreachable: the constructor refuses a build without CUDA
#endif
  return outputs_;
}

}  // namespace loom::train_gpt
