// A plain C++ training loop adopted to Loom's Fabric. The lines marked "Fabric" are the
// only changes against the single-process loop; the same program runs as
//   fabric_loop                                            (single_device)
//   loomrun --nproc-per-node 2 fabric_loop --strategy ddp  (DDP over 2 processes)
//   fabric_loop --strategy my_ddp                          (a strategy registered below)
//   loomrun --nproc-per-node 2 fabric_loop --strategy fsdp --save out.safetensors
//                                                          (FSDP; any sharded name works)
//   fabric_loop --stop-after 10 --state DIR; fabric_loop --resume DIR   (resumable state)

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "data/default_corpus.h"
#include "data/token_blocks.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "strategies/ddp/ddp_strategy.h"
#include "strategies/fabric.h"

namespace {

// A user strategy, registered at run time and then selectable by name like a built-in:
// DDP that logs each synchronised backward pass.
class LoggingDDP : public loom::strategies::DDPStrategy {
 public:
  using DDPStrategy::DDPStrategy;
  std::string name() const override { return "my_ddp"; }
  void backward(const loom::Tensor& loss) override {
    DDPStrategy::backward(loss);
    ++backwards_;
  }
  void teardown() override {
    if (is_global_zero()) std::printf("my_ddp: %d synchronised backward passes\n", backwards_);
    DDPStrategy::teardown();
  }

 private:
  int backwards_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string strategy = "single_device", save_path, state_path, resume_path;
  int stop_after = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--strategy") == 0) strategy = argv[i + 1];
    if (std::strcmp(argv[i], "--save") == 0) save_path = argv[i + 1];
    if (std::strcmp(argv[i], "--state") == 0) state_path = argv[i + 1];    // save state at the end
    if (std::strcmp(argv[i], "--resume") == 0) resume_path = argv[i + 1];  // continue a state
    if (std::strcmp(argv[i], "--stop-after") == 0) stop_after = std::atoi(argv[i + 1]);
  }
  namespace strategies = loom::strategies;
  strategies::StrategyRegistry::add(
      "my_ddp", {.factory =
                     [](const strategies::StrategyConfig& c) {
                       return std::make_unique<LoggingDDP>(c, c.ddp);
                     },
                 .description = "DDP that counts its backward passes (examples/fabric_loop.cpp)",
                 .kind = strategies::StrategyKind::DataParallel});

  loom::Fabric fabric({.strategy = strategy});  // Fabric
  fabric.launch();                              // Fabric

  loom::nn::GPTConfig config;
  config.layers = 2;
  config.embd = 64;
  config.context = 64;
  loom::nn::GPT model(config, /*seed=*/0);
  loom::optim::AdamW optimizer(model.parameters(), {.lr = 1e-3});
  fabric.setup_module(model);         // Fabric
  fabric.setup_optimizer(optimizer);  // Fabric

  // Fabric: the training state to resume from, as Lightning's fabric.save/load take it.
  loom::Fabric::State state{.module = &model, .optimizer = &optimizer, .tensors = {}};
  int first_step = 0;
  if (!resume_path.empty()) {
    fabric.load(resume_path, state);
    first_step = static_cast<int>(state.tensors.at("step").item());
  }

  loom::data::TokenBlocks data(loom::data::default_corpus(1 << 16), 4, 64, 256);
  for (int step = first_step; step < stop_after; ++step) {
    // Fabric: each rank reads its own blocks.
    auto batch = data.for_step(step, fabric.rank(), fabric.world_size());
    loom::Tensor loss = model.loss(batch.tokens, batch.targets);
    fabric.backward(loss);  // Fabric: was loss.backward()
    fabric.clip_gradients(model, 1.0);
    fabric.step(optimizer);  // Fabric: was optimizer.step()
    optimizer.zero_grad();
    double mean_loss = fabric.all_reduce(loss.detach()).item();  // Fabric: sync_dist mean
    if (fabric.is_global_zero() && step % 5 == 4) {              // Fabric
      std::printf("step %d loss %.4f (%d ranks)\n", step + 1, mean_loss, fabric.world_size());
    }
  }
  // Fabric: every rank calls save (sharded strategies gather the model for it); rank 0 writes.
  if (!save_path.empty()) fabric.save(save_path, model.state_dict());
  if (!state_path.empty()) {
    state.tensors["step"] = loom::Tensor::from_vector<int64_t>({stop_after}, {});
    fabric.save(state_path, state);
  }
  return 0;
}
