#pragma once
// Units of a sharded model: the modules whose parameters are gathered, freed and reduced
// together (FSDP's wrapped modules). The root module is always a unit; an auto-wrap policy
// (or a manual list) chooses more, nested inside it. Each parameter belongs to the smallest
// unit that contains every module using it: its owner plus the modules that declare reading
// it (Module::used_parameters(), e.g. GPT's tied output head), so a tied embedding lands in
// the unit that encloses both uses.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"

namespace loom::strategies::sharded {

// Decides whether `module` (at dotted `path`, "" for the root) becomes a unit.
// `unwrapped_params` counts the parameters of its subtree not already in a wrapped
// descendant (policies are applied bottom-up, as FSDP's size-based policy is).
using WrapPolicy = std::function<bool(const nn::Module& module, const std::string& path,
                                      int64_t unwrapped_params)>;

// Every module whose class is named `type_name` (the unqualified C++ name, e.g. "Block").
WrapPolicy wrap_modules_of_type(std::string type_name);
// Every module whose unwrapped subtree holds at least `min_num_params` parameters
// (FSDP's size_based_auto_wrap_policy).
WrapPolicy wrap_min_num_params(int64_t min_num_params);
// The policy a spec names: "" or "none" (the root only), "params" (every module that owns
// parameters, DeepSpeed ZeRO-3's per-module fetch), "min_params:N", or a class name.
WrapPolicy make_wrap_policy(const std::string& spec);
// The same for `model`: a class name that no module of `model` has is an error naming the
// classes it has (a typo must not silently make the whole model one unit).
WrapPolicy make_wrap_policy(const std::string& spec, const nn::Module& model);

// The unqualified class name of a module, without template arguments ("Block" for
// loom::nn::Block, "ModuleList" for loom::nn::ModuleList<Block>).
std::string module_type_name(const nn::Module& module);

struct Unit {
  const nn::Module* module = nullptr;
  std::string path;              // "" for the root
  std::vector<size_t> params;    // indices into root.named_parameters(), ascending
  int parent = -1;               // enclosing unit (-1 for the root)
};

struct UnitPlan {
  std::vector<Unit> units;  // pre-order: units[0] is the root, parents before children
  bool policy_matched = false;  // false when the policy chose no module but the root
};

// Chooses the units of `root`: the root, the modules `policy` accepts (may be null) and the
// ones in `manual`. A unit's module must run its forward through Module::run_forward (every
// built-in module does), since that is where its parameters are gathered; containers
// (ModuleList) are never chosen, and naming one in `manual` is an error. Units that end up owning no parameter are dropped (a tied embedding's
// own module, say). Deterministic: the same model gives the same plan on every rank.
UnitPlan plan_units(const nn::Module& root, const WrapPolicy& policy,
                    const std::vector<const nn::Module*>& manual = {});

}  // namespace loom::strategies::sharded
