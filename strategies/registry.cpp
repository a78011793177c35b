#include "strategies/registry.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "strategies/data_parallel.h"

namespace loom::strategies {

namespace {

struct Entry {
  StrategyFactory factory;
  std::string description;
  OptionsDefaults defaults;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> entries;
  Registry() {
    entries["single_device"] = {
        [](const StrategyOptions& o) { return std::make_unique<SingleDeviceStrategy>(o); },
        "everything on one device in one process",
        {}};
    entries["ddp"] = {[](const StrategyOptions& o) { return std::make_unique<DDPStrategy>(o); },
                      "distributed data parallel: one process per device (launch with loomrun)",
                      {}};
    entries["dp"] = {
        [](const StrategyOptions& o) { return std::make_unique<DataParallelStrategy>(o); },
        "data parallel in one process: the module replicated over --devices threads, the batch "
        "split by rows",
        {}};
    entries["ddp_spawn"] = {
        [](const StrategyOptions& o) { return std::make_unique<DDPLaunchingStrategy>(o, false); },
        "ddp whose ranks the program starts itself (re-executes itself --devices times)",
        {}};
    entries["ddp_fork"] = {
        [](const StrategyOptions& o) { return std::make_unique<DDPLaunchingStrategy>(o, true); },
        "ddp whose ranks the program forks itself (--devices processes)",
        {}};
    entries["ddp_find_unused_parameters_true"] = {
        [](const StrategyOptions& o) { return std::make_unique<DDPStrategy>(o); },
        "ddp that tolerates parameters without gradients",
        [](StrategyOptions& o) { o.ddp.find_unused_parameters = true; }};
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string closest_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& c : candidates) {
    size_t d = edit_distance(name, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

void fail_unknown_name(const char* component, const char* kind, const std::string& name,
                       const std::vector<std::string>& known) {
  std::string list;
  for (const std::string& n : known)
    list += (list.empty() ? "" : ", ") + n;
  fail("[", component, "] unknown ", kind, " '", name, "'; did you mean '",
       closest_name(name, known), "'? Available: ", list);
}

void StrategyRegistry::register_strategy(const std::string& name, StrategyFactory factory,
                                         std::string description, OptionsDefaults defaults) {
  if (name.empty()) fail("[strategy] register_strategy: the name is empty");
  if (!factory) fail("[strategy] register_strategy('", name, "'): the factory is empty");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (r.entries.count(name)) fail("[strategy] a strategy named '", name, "' is already registered");
  r.entries[name] = {std::move(factory), std::move(description), std::move(defaults)};
}

bool StrategyRegistry::remove(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.entries.erase(name) > 0;
}

std::unique_ptr<Strategy> StrategyRegistry::get(const std::string& name, StrategyOptions options) {
  Entry entry;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.entries.find(name);
    if (it == r.entries.end()) {
      std::vector<std::string> names;
      for (const auto& [n, e] : r.entries)
        names.push_back(n);
      fail_unknown_name("strategy", "strategy", name, names);
    }
    entry = it->second;
  }
  if (entry.defaults) entry.defaults(options);
  return entry.factory(options);
}

std::vector<std::pair<std::string, std::string>> StrategyRegistry::available_strategies() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, entry] : r.entries)
    out.emplace_back(name, entry.description);
  return out;
}

}  // namespace loom::strategies
