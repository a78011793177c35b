// train_gpt's training loop (tools/train_gpt/trainer.h) on the emulated CUDA device:
// --cuda-graph's steps (the first eager, the whole step captured at the second and replayed
// after it) report the losses, gradient norms and learning rates of eager steps, bit for bit,
// and leave the same weights, with a warmup and cosine schedule so that the learning rate of
// every replayed step is new.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/default_corpus.h"
#include "data/token_blocks.h"
#include "nn/gpt.h"
#include "runtime/work_log.h"
#include "strategies/strategy.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {
namespace {

struct TrainedRun {
  std::vector<StepMetrics> steps;
  std::vector<std::vector<float>> weights;
  size_t graph_launches = 0;  // on the emulated device
};

TrainedRun train_on_cuda(TrainOptions o, const std::string& precision, bool cuda_graph) {
  o.cuda_graph = cuda_graph;
  const data::TokenBlocks data(data::default_corpus(1 << 14), o.batch, o.model.context,
                               o.model.vocab_size);
  nn::GPT model(o.model, 3);
  strategies::StrategyOptions options;
  options.accelerator = "cuda";
  options.precision = precision;
  strategies::SingleDeviceStrategy strategy(options);
  TrainedRun run;
  cuda_emulation::WorkLog log;
  train(model, data, o, [&](const StepMetrics& m) { run.steps.push_back(m); }, &strategy);
  for (const cuda_emulation::Work& w : log.entries())
    run.graph_launches += w.kind == cuda_emulation::WorkKind::kGraph ? 1 : 0;
  for (const Tensor& p : model.parameters())
    run.weights.push_back(p.to(Device::cpu()).to_vector<float>());
  return run;
}

TEST(EmulatedTrainer, CudaGraphStepsKeepTheBitsOfEagerSteps) {
  TrainOptions o;
  o.model.vocab_size = 256;
  o.model.context = 16;
  o.model.layers = 2;
  o.model.heads = 2;
  o.model.embd = 32;
  o.batch = 2;
  o.steps = 5;
  o.lr = 3e-3;
  o.schedule = "cosine";
  o.warmup_steps = 2;
  for (const std::string precision : {"32-true", "bf16-mixed"}) {
    SCOPED_TRACE(precision);
    const TrainedRun eager = train_on_cuda(o, precision, false);
    const TrainedRun graphed = train_on_cuda(o, precision, true);
    ASSERT_EQ(graphed.steps.size(), 5u);
    ASSERT_EQ(eager.steps.size(), 5u);
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_EQ(graphed.steps[k].loss, eager.steps[k].loss) << "step " << k;
      EXPECT_EQ(graphed.steps[k].grad_norm, eager.steps[k].grad_norm) << "step " << k;
      EXPECT_EQ(graphed.steps[k].lr, eager.steps[k].lr) << "step " << k;
    }
    EXPECT_NE(eager.steps[3].lr, eager.steps[4].lr);
    EXPECT_EQ(eager.graph_launches, 0u);
    EXPECT_EQ(graphed.graph_launches, 4u) << "steps 2 to 5 replayed";
    EXPECT_EQ(graphed.weights, eager.weights);
  }
}

}  // namespace
}  // namespace loom::train_gpt
