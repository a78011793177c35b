#include "strategies/sharded/units.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <typeinfo>

#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies::sharded {

std::string module_type_name(const nn::Module& module) {
  const char* mangled = typeid(module).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  size_t template_start = name.find('<');
  std::string head = name.substr(0, template_start);
  size_t colon = head.rfind("::");
  return colon == std::string::npos ? head : head.substr(colon + 2);
}

WrapPolicy wrap_modules_of_type(std::string type_name) {
  return [type_name = std::move(type_name)](const nn::Module& m, const std::string&, int64_t) {
    return module_type_name(m) == type_name;
  };
}

WrapPolicy wrap_min_num_params(int64_t min_num_params) {
  if (min_num_params < 1)
    tag::kSharded.fail("min_num_params must be at least 1, got ", min_num_params);
  return [min_num_params](const nn::Module&, const std::string&, int64_t unwrapped) {
    return unwrapped >= min_num_params;
  };
}

WrapPolicy make_wrap_policy(const std::string& spec) {
  if (spec.empty() || spec == "none") return nullptr;
  if (spec == "params") {
    return [](const nn::Module& m, const std::string&, int64_t) {
      int64_t own = m.parameter_count();
      for (const auto& [name, child] : m.children())
        own -= child->parameter_count();
      return own > 0;
    };
  }
  const std::string prefix = "min_params:";
  if (spec.rfind(prefix, 0) == 0) {
    char* end = nullptr;
    long long n = std::strtoll(spec.c_str() + prefix.size(), &end, 10);
    if (end == spec.c_str() + prefix.size() || *end != '\0' || n < 1) {
      tag::kSharded.fail("wrap policy '", spec,
                         "': expected min_params:N with N a positive integer");
    }
    return wrap_min_num_params(n);
  }
  for (char c : spec) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) {
      tag::kSharded.fail(
          "wrap policy '", spec,
          "' is not understood; expected none, params, min_params:N or a module class name "
          "such as Block");
    }
  }
  return wrap_modules_of_type(spec);
}

namespace {

void collect_type_names(const nn::Module& m, std::set<std::string>& names) {
  names.insert(module_type_name(m));
  for (const auto& [name, child] : m.children())
    collect_type_names(*child, names);
}

}  // namespace

WrapPolicy make_wrap_policy(const std::string& spec, const nn::Module& model) {
  WrapPolicy policy = make_wrap_policy(spec);
  const bool names_a_class = policy && spec != "params" && spec.rfind("min_params:", 0) != 0;
  if (!names_a_class) return policy;
  std::set<std::string> classes;
  collect_type_names(model, classes);
  if (classes.count(spec)) return policy;
  std::string listed;
  for (const std::string& c : classes)
    listed += (listed.empty() ? "" : ", ") + c;
  tag::kSharded.fail("wrap policy '", spec, "' names no module class of this model; its classes are ",
                     listed, " (or use none, params, min_params:N)");
}

namespace {

struct ModuleInfo {
  const nn::Module* module;
  std::string path;
  int parent;                    // index into the module list
  std::vector<const TensorImpl*> own;  // parameters registered on this module
};

void list_modules(const nn::Module& m, const std::string& path, int parent,
                  std::vector<ModuleInfo>& out) {
  ModuleInfo info{&m, path, parent, {}};
  // Own parameters: those of named_parameters() not under a child.
  std::map<const TensorImpl*, bool> in_children;
  for (const auto& [name, child] : m.children())
    for (const Tensor& p : child->parameters())
      in_children[p.impl_ptr().get()] = true;
  for (const Tensor& p : m.parameters())
    if (!in_children.count(p.impl_ptr().get())) info.own.push_back(p.impl_ptr().get());
  int self = static_cast<int>(out.size());
  out.push_back(std::move(info));
  for (const auto& [name, child] : m.children())
    list_modules(*child, path.empty() ? name : path + "." + name, self, out);
}

}  // namespace

UnitPlan plan_units(const nn::Module& root, const WrapPolicy& policy,
                    const std::vector<const nn::Module*>& manual) {
  std::vector<ModuleInfo> modules;
  list_modules(root, "", -1, modules);
  const size_t count = modules.size();

  // Bottom-up (children come after parents in `modules`): count each subtree's parameters
  // not in a wrapped descendant and ask the policy.
  std::vector<bool> wrapped(count, false);
  std::vector<int64_t> unwrapped(count, 0);
  for (size_t i = count; i-- > 0;) {
    for (const TensorImpl* p : modules[i].own)
      unwrapped[i] += numel_of(p->shape);
    bool manual_pick = std::find(manual.begin(), manual.end(), modules[i].module) != manual.end();
    // A container has no forward of its own, so its hooks would never run (FSDP's size
    // policy skips ModuleList for the same reason).
    const bool container = module_type_name(*modules[i].module) == "ModuleList";
    if (manual_pick && container) {
      tag::kSharded.fail(
          "module '", modules[i].path,
          "' is a ModuleList, which has no forward to gather its parameters around; wrap "
          "its elements instead");
    }
    bool pick = i > 0 && !container &&
                (manual_pick || (policy && policy(*modules[i].module, modules[i].path,
                                                  unwrapped[i])));
    wrapped[i] = i == 0 || pick;
    if (!pick && i > 0) unwrapped[modules[i].parent] += unwrapped[i];
  }

  // The chain of wrapped ancestors (root first) of each module.
  auto unit_chain = [&](size_t i) {
    std::vector<size_t> chain;
    for (int m = static_cast<int>(i); m >= 0; m = modules[m].parent)
      if (wrapped[m]) chain.push_back(static_cast<size_t>(m));
    std::reverse(chain.begin(), chain.end());
    return chain;
  };

  // Parameter index (first occurrence in named_parameters order) and its users.
  std::map<const TensorImpl*, size_t> index;
  for (const auto& [name, p] : root.named_parameters())
    index.emplace(p.impl_ptr().get(), index.size());
  std::map<const TensorImpl*, std::vector<size_t>> users;
  for (size_t i = 0; i < count; ++i) {
    for (const TensorImpl* p : modules[i].own)
      users[p].push_back(i);
    for (const Tensor& p : modules[i].module->used_parameters())
      if (index.count(p.impl_ptr().get())) users[p.impl_ptr().get()].push_back(i);
  }
  // Each parameter goes to the deepest unit common to all its users' chains.
  std::map<size_t, std::vector<size_t>> params_of_module;
  for (const auto& [p, who] : users) {
    std::vector<size_t> common = unit_chain(who[0]);
    for (size_t k = 1; k < who.size(); ++k) {
      std::vector<size_t> other = unit_chain(who[k]);
      size_t n = 0;
      while (n < common.size() && n < other.size() && common[n] == other[n])
        ++n;
      common.resize(n);
    }
    params_of_module[common.back()].push_back(index.at(p));
  }

  UnitPlan plan;
  std::map<size_t, int> unit_of_module;
  for (size_t i = 0; i < count; ++i) {
    if (!wrapped[i]) continue;
    auto found = params_of_module.find(i);
    if (i > 0 && found == params_of_module.end()) continue;  // owns nothing
    Unit unit{modules[i].module, modules[i].path, {}, -1};
    if (found != params_of_module.end()) unit.params = found->second;
    std::sort(unit.params.begin(), unit.params.end());
    for (int m = modules[i].parent; m >= 0; m = modules[m].parent) {
      auto u = unit_of_module.find(static_cast<size_t>(m));
      if (u != unit_of_module.end()) {
        unit.parent = u->second;
        break;
      }
    }
    unit_of_module[i] = static_cast<int>(plan.units.size());
    plan.units.push_back(std::move(unit));
  }
  plan.policy_matched = plan.units.size() > 1;
  return plan;
}

}  // namespace loom::strategies::sharded
