#pragma once
// StrategyRegistry: strategies by name, as in Lightning. Built-ins registered at start-up:
// single_device, dp, the ddp names, the sharded names (deepspeed*, fsdp*), pipeline and
// model_parallel. A user strategy registered at run time is selectable everywhere a built-in
// is (train_gpt --strategy, Fabric, loom-perf strategy); examples/custom_strategy/ adds one
// with its own options:
//   StrategyRegistry::add("ddp_ema",
//       {.factory = [](const StrategyConfig& c) { return std::make_unique<EmaDDP>(c, ...); },
//        .description = "ddp keeping an exponential moving average of the weights",
//        .kind = StrategyKind::DataParallel,
//        .flags = {"--ema-decay"}});
//
// The verbs are every Loom registry's (core/registry.h): add, remove, contains, create, list.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strategies/ddp/options.h"
#include "strategies/pipeline/options.h"
#include "strategies/sharded/options.h"
#include "strategies/strategy.h"
#include "strategies/tp/options.h"

namespace loom::strategies {

// What a front end (train_gpt's flags, a DeepSpeed config, Fabric, loom-perf) fills for a
// strategy it chooses by name: the options every strategy shares (the base) and each built-in
// family's own. create() hands all of it to the chosen entry's factory, which passes on the
// part its strategy reads.
struct StrategyConfig : StrategyOptions {
  DDPOptions ddp = {};  // the ddp names
  // The sharded names (docs/sharding.md): each name's defaults set the stage and offload;
  // users set the wrap policy and prefetching.
  sharded::ShardingOptions sharding = {};
  // FSDP's sharding_strategy for the fsdp names: FULL_SHARD (default), SHARD_GRAD_OP,
  // NO_SHARD, HYBRID_SHARD; their defaults apply it to `sharding`.
  std::string fsdp_sharding_strategy = "FULL_SHARD";
  pipeline::PipelineOptions pipeline = {};     // pipeline
  TensorParallelOptions tensor_parallel = {};  // model_parallel, and pipeline's pp x tp
  // The values of flags that strategies registered outside the library declare, by flag name
  // as the front end spells it ("--ema-decay" -> "0.99"); their factories parse them.
  std::map<std::string, std::string> extra = {};
};

// What a front end does differently for a strategy before building it (how many ranks to
// start, which checks apply, which memory model estimates it).
enum class StrategyKind {
  SingleDevice,        // one process, one device
  DataParallel,        // one process per device, each with the whole model (ddp and variants)
  ThreadDataParallel,  // one process, the model replicated over device threads (dp)
  Sharded,             // model states split over the ranks (ZeRO, FSDP)
  Pipeline,            // the layers split into stages (pp x dp, pp x tp x dp)
  TensorParallel,      // every layer split over ranks (tp x dp)
  Other,               // none of these: no special treatment
};
const char* strategy_kind_name(StrategyKind kind);

using StrategyFactory = std::function<std::unique_ptr<Strategy>(const StrategyConfig&)>;
// Adjusts the caller's config before the factory sees it (a name's defaults, e.g.
// find_unused_parameters for ddp_find_unused_parameters_true); may refuse it (loom::Error).
using ConfigDefaults = std::function<void(StrategyConfig&)>;
// The names before 2026-12-03.
using OptionsDefaults [[deprecated("use ConfigDefaults")]] = ConfigDefaults;

struct StrategyEntry {
  StrategyFactory factory;
  std::string description;
  StrategyKind kind = StrategyKind::Other;
  // The flags it reads beyond the shared ones (accelerator, devices, precision, ...), as
  // front ends spell them ("--bucket-cap-mb"): a front end refuses such a flag when the
  // chosen strategy does not declare it, naming those that do.
  std::vector<std::string> flags = {};
  ConfigDefaults defaults = {};
};

class StrategyRegistry {
 public:
  // Throws loom::Error when the name is empty or taken, or the factory empty.
  static void add(const std::string& name, StrategyEntry entry);
  static bool remove(const std::string& name);
  static bool contains(const std::string& name);
  // Creates the strategy `name` from `config` with the name's defaults applied; an unknown
  // name is loom::Error listing the available names and the closest match.
  static std::unique_ptr<Strategy> create(const std::string& name, StrategyConfig config = {});
  // The same with every strategy's own options at their defaults.
  static std::unique_ptr<Strategy> create(const std::string& name, const StrategyOptions& options);
  // A copy of the entry `name` (its kind and flags), for checks made before building.
  static StrategyEntry entry(const std::string& name);
  // `config` as create() hands it to the factory (the name's defaults applied), without
  // building the strategy.
  static StrategyConfig with_defaults(const std::string& name, StrategyConfig config);
  // (name, description) of every registered strategy, sorted by name.
  static std::vector<std::pair<std::string, std::string>> list();
  // The registered names whose entry declares `flag`, sorted.
  static std::vector<std::string> names_reading(const std::string& flag);

  // The verbs before 2026-12-03, kept for existing programs.
  [[deprecated("use StrategyRegistry::add")]] static void register_strategy(
      const std::string& name, StrategyFactory factory, std::string description,
      ConfigDefaults defaults = {});
  [[deprecated("use StrategyRegistry::create")]] static std::unique_ptr<Strategy> get(
      const std::string& name, StrategyConfig config = {});
  [[deprecated("use StrategyRegistry::create")]] static std::unique_ptr<Strategy> get(
      const std::string& name, const StrategyOptions& options);
  [[deprecated(
      "use StrategyRegistry::list")]] static std::vector<std::pair<std::string, std::string>>
  available_strategies();
};

}  // namespace loom::strategies
