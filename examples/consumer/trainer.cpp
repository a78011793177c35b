// A small trainer written against the installed Loom package: its own module (a two-layer
// MLP learning y = sum of x), Fabric with a strategy chosen by name, and a strategy of its
// own registered at run time. Prints one line per rank at the end.
//   consumer [--strategy NAME] [--steps N]

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "nn/layers.h"
#include "nn/module.h"
#include "optim/adamw.h"
#include "strategies/ddp/ddp_strategy.h"
#include "strategies/fabric.h"
#include "strategies/registry.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace {

class Regressor : public loom::nn::Module {
 public:
  explicit Regressor(loom::Generator& gen) {
    hidden_ = register_module("hidden", std::make_shared<loom::nn::Linear>(8, 32, gen, 0.3));
    out_ = register_module("out", std::make_shared<loom::nn::Linear>(32, 1, gen, 0.3));
  }
  loom::Tensor forward(const loom::Tensor& x) const {
    return run_forward([&] { return out_->forward(loom::gelu(hidden_->forward(x))); });
  }

 private:
  std::shared_ptr<loom::nn::Linear> hidden_, out_;
};

// DDP that counts its synchronised backward passes: a user strategy, selectable by name.
class CountingDDP : public loom::strategies::DDPStrategy {
 public:
  using DDPStrategy::DDPStrategy;
  std::string name() const override { return "my_ddp"; }
  void backward(const loom::Tensor& loss) override {
    DDPStrategy::backward(loss);
    ++backwards_;
  }
  int backwards() const { return backwards_; }

 private:
  int backwards_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string strategy = "single_device";
  int steps = 30;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--strategy") == 0) strategy = argv[i + 1];
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
  }
  namespace strategies = loom::strategies;
  strategies::StrategyRegistry::add(
      "my_ddp", {.factory =
                     [](const strategies::StrategyConfig& c) {
                       return std::make_unique<CountingDDP>(c, c.ddp);
                     },
                 .description = "DDP that counts its backward passes (examples/consumer)",
                 .kind = strategies::StrategyKind::DataParallel});
  try {
    loom::Fabric fabric({.strategy = strategy});
    fabric.launch();
    loom::Generator gen(0);
    Regressor model(gen);
    loom::optim::AdamW optimizer(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
    fabric.setup_module(model);
    fabric.setup_optimizer(optimizer);
    double first = 0, last = 0;
    for (int step = 0; step < steps; ++step) {
      // Each rank its own 16 rows; the target is the sum of the inputs.
      loom::Generator data(1000 + static_cast<uint64_t>(step * fabric.world_size() + fabric.rank()));
      loom::Tensor x = loom::Tensor::empty({16, 8});
      loom::normal_(x, 0.0, 1.0, data);
      loom::Tensor y = loom::sum(x, {1}, /*keepdim=*/true);
      loom::Tensor diff = loom::sub(model.forward(x), y);
      loom::Tensor loss = loom::mean(loom::mul(diff, diff));
      fabric.backward(loss);
      fabric.step(optimizer);
      optimizer.zero_grad();
      const double mean = fabric.all_reduce(loss.detach()).item();
      (step == 0 ? first : last) = mean;
    }
    int counted = -1;
    if (auto* mine = dynamic_cast<CountingDDP*>(&fabric.strategy())) counted = mine->backwards();
    std::printf("consumer rank %d of %d (%s): loss %.4f -> %.4f%s\n", fabric.rank(),
                fabric.world_size(), fabric.strategy().name().c_str(), first, last,
                counted >= 0 ? (", " + std::to_string(counted) + " counted backward passes").c_str()
                             : "");
    return last < first ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
