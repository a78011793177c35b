// Adding a strategy with options of its own (ema_strategy.h), and a front end that takes every
// strategy's flags from the registry instead of knowing them:
//   loomrun --nproc-per-node 2 custom_strategy --strategy ddp_ema --ema-decay 0.9
//   loomrun --nproc-per-node 2 custom_strategy --strategy ddp --bucket-cap-mb 1
// Flags: --strategy NAME, --steps N, and any flag the chosen strategy's entry declares.
// Prints the mean loss every 5 steps and, for ddp_ema, how far the average is from the weights.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "data/default_corpus.h"
#include "data/token_blocks.h"
#include "ema_strategy.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "strategies/registry.h"
#include "tensor/ops.h"

namespace strategies = loom::strategies;

namespace {

// --flag value pairs: --strategy and --steps are this program's; the others go to the chosen
// strategy, which must declare them (StrategyEntry::flags).
strategies::StrategyConfig parse(int argc, char** argv, std::string& name, int& steps) {
  strategies::StrategyConfig config;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) loom::fail(flag, " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--strategy") {
      name = value;
    } else if (flag == "--steps") {
      steps = std::atoi(value.c_str());
    } else {
      config.extra[flag] = value;
    }
  }
  const strategies::StrategyEntry entry = strategies::StrategyRegistry::entry(name);
  for (const auto& [flag, value] : config.extra) {
    if (std::find(entry.flags.begin(), entry.flags.end(), flag) != entry.flags.end()) continue;
    std::string readers;
    for (const std::string& reader : strategies::StrategyRegistry::names_reading(flag))
      readers += (readers.empty() ? "" : ", ") + reader;
    loom::fail(flag, ": strategy ", name, " does not read it",
               readers.empty() ? std::string(" (no strategy does)")
                               : " (the strategies that do: " + readers + ")");
  }
  // The built-in families' flags this front end knows how to type (one shown here).
  if (auto it = config.extra.find("--bucket-cap-mb"); it != config.extra.end())
    config.ddp.bucket_cap_mb = std::atof(it->second.c_str());
  return config;
}

}  // namespace

int main(int argc, char** argv) try {
  // The one line that adds the strategy: selectable by name from here on.
  strategies::StrategyRegistry::add("ddp_ema", example::ema_strategy_entry());

  std::string name = "ddp_ema";
  int steps = 20;
  const strategies::StrategyConfig config = parse(argc, argv, name, steps);
  std::unique_ptr<strategies::Strategy> strategy =
      strategies::StrategyRegistry::create(name, config);
  strategy->setup_environment();

  loom::nn::GPTConfig model_config;
  model_config.layers = 1;
  model_config.embd = 32;
  model_config.heads = 2;
  model_config.context = 32;
  loom::nn::GPT model(model_config, /*seed=*/0);
  loom::optim::AdamW optimizer(model.parameters(), {.lr = 1e-3});
  strategy->setup_module(model);
  strategy->setup_optimizer(optimizer);

  loom::data::TokenBlocks data(loom::data::default_corpus(1 << 14), 4, 32, 256);
  for (int step = 0; step < steps; ++step) {
    const loom::data::Batch batch =
        data.for_step(step, strategy->data_parallel_rank(), strategy->data_parallel_size());
    const loom::Tensor loss = strategy->train_batch(
        batch.tokens, batch.targets, [&](loom::nn::Module& m, int64_t, int64_t) {
          return static_cast<loom::nn::GPT&>(m).loss(batch.tokens, batch.targets);
        });
    strategy->optimizer_step(optimizer);
    optimizer.zero_grad();
    loom::Tensor mean = loom::Tensor::full({1}, loss.item(), loom::DType::F64);
    const double mean_loss = strategy->all_reduce(mean).item();
    if (strategy->is_global_zero() && step % 5 == 4)
      std::printf("step %d loss %.4f (%d ranks)\n", step + 1, mean_loss, strategy->world_size());
  }
  if (const auto* ema = dynamic_cast<const example::EmaDDPStrategy*>(strategy.get())) {
    double farthest = 0;
    for (const auto& [param_name, param] : model.named_parameters()) {
      const std::vector<float> w = param.contiguous().to_vector<float>();
      const std::vector<float> a = ema->averaged().at(param_name).contiguous().to_vector<float>();
      for (size_t i = 0; i < w.size(); ++i)
        farthest = std::max(farthest, static_cast<double>(std::fabs(w[i] - a[i])));
    }
    if (strategy->is_global_zero())
      std::printf("ddp_ema: decay %g, largest |average - weight| %.9g\n",
                  example::ema_options(config).decay, farthest);
  }
  strategy->teardown();
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
