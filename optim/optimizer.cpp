#include "optim/optimizer.h"

#include <cmath>
#include <set>
#include <sstream>
#include <string_view>
#include <utility>

#include "core/tags.h"

namespace loom::optim {

namespace {

// Parses "state.<g>.<i>.<name>"; returns false when `key` has another form.
bool parse_state_key(const std::string& key, size_t& group, size_t& index, std::string& name) {
  constexpr std::string_view kPrefix = "state.";
  if (key.rfind(kPrefix, 0) != 0) return false;
  size_t first = kPrefix.size();
  size_t dot1 = key.find('.', first);
  if (dot1 == std::string::npos) return false;
  size_t dot2 = key.find('.', dot1 + 1);
  if (dot2 == std::string::npos) return false;
  try {
    size_t used = 0;
    std::string g = key.substr(first, dot1 - first);
    std::string i = key.substr(dot1 + 1, dot2 - dot1 - 1);
    group = std::stoul(g, &used);
    if (used != g.size()) return false;
    index = std::stoul(i, &used);
    if (used != i.size()) return false;
  } catch (const std::exception&) {
    return false;
  }
  name = key.substr(dot2 + 1);
  return !name.empty();
}

Tensor scalar_f64(double value) {
  return Tensor::from_vector<double>({value}, {});
}

double read_scalar(const std::string& key, const Tensor& t) {
  if (!t.defined() || t.numel() != 1)
    tag::kOptim.fail("load_state_dict: ", key, " must be a scalar");
  return t.item();
}

MemoryKind state_kind_for(const Tensor& param) {
  return param.storage()->kind() == MemoryKind::Offloaded ? MemoryKind::Offloaded
                                                          : MemoryKind::OptimizerState;
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups, std::string name)
    : groups_(std::move(groups)), name_(std::move(name)) {
  size_t count = 0;
  std::set<const TensorImpl*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    check_group(g);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      if (!p.defined()) fail(describe(g, i), " is undefined");
      if (!p.is_leaf()) {
        fail(describe(g, i), " is the output of an op; an optimizer updates leaf tensors only");
      }
      // A 16-bit parameter is checked at the first step instead: a sharded strategy with
      // 16-bit weights (ShardingOptions::weights_dtype) hands the optimizer f32 masters.
      if (!is_16bit_float(p.dtype())) checked_grad(g, i);
      if (!seen.insert(p.impl_ptr().get()).second) {
        fail(describe(g, i), " appears more than once in the parameter groups");
      }
      ++count;
    }
  }
  if (count == 0) tag::kOptim.fail(name_, ": got an empty parameter list");
}

std::vector<ParamGroup> Optimizer::with_defaults(std::vector<ParamGroup> groups, double lr,
                                                 double weight_decay) {
  for (ParamGroup& group : groups) {
    if (std::isnan(group.lr)) group.lr = lr;
    if (std::isnan(group.weight_decay)) group.weight_decay = weight_decay;
  }
  return groups;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  if (hooks_.begin) hooks_.begin();
  for (size_t g = 0; g < groups_.size(); ++g) {
    check_group(g);
    std::vector<Tensor> params, grads;
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      Tensor grad = checked_grad(g, i);
      if (!grad.defined()) continue;  // torch skips parameters without a gradient
      if (hooks_.before_update) {
        hooks_.before_update(g, i);
        update(groups_[g], groups_[g].params[i], grad);
        continue;
      }
      params.push_back(groups_[g].params[i]);
      grads.push_back(std::move(grad));
    }
    if (!hooks_.before_update) update_group(groups_[g], params, grads);
  }
  if (hooks_.end) hooks_.end();
  ++step_count_;
}

std::vector<Tensor> Optimizer::state_tensors(const Tensor& param) const {
  std::map<std::string, Tensor> named;
  export_param_state(param, named);
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named)
    if (tensor.shape() == param.shape()) out.push_back(tensor);
  return out;
}

void Optimizer::update_group(const ParamGroup& group, const std::vector<Tensor>& params,
                             const std::vector<Tensor>& grads) {
  for (size_t i = 0; i < params.size(); ++i)
    update(group, params[i], grads[i]);
}

void Optimizer::zero_grad() {
  for (ParamGroup& group : groups_) {
    for (Tensor& p : group.params)
      p.set_grad(Tensor());
  }
}

std::vector<Tensor> Optimizer::parameters() const {
  std::vector<Tensor> all;
  for (const ParamGroup& group : groups_) {
    all.insert(all.end(), group.params.begin(), group.params.end());
  }
  return all;
}

void Optimizer::check_group(size_t group) const {
  const ParamGroup& g = groups_.at(group);
  if (!(std::isfinite(g.lr) && g.lr >= 0.0)) {
    tag::kOptim.fail(
        name_, ": group ", group, " has learning rate ", g.lr,
        "; expected a finite value >= 0 (set ParamGroup::lr or the optimizer's default)");
  }
  if (!(std::isfinite(g.weight_decay) && g.weight_decay >= 0.0)) {
    tag::kOptim.fail(name_, ": group ", group, " has weight_decay ", g.weight_decay,
                     "; expected a finite value >= 0");
  }
}

std::string Optimizer::describe(size_t group, size_t index) const {
  std::ostringstream out;
  out << tag::kOptim.prefix() << name_ << ": parameter " << index << " of group " << group << " ("
      << groups_.at(group).params.at(index).str() << ")";
  return out.str();
}

Tensor Optimizer::checked_grad(size_t group, size_t index) const {
  const Tensor& p = groups_.at(group).params.at(index);
  bool supported_dtype = p.device().is_cpu()
                             ? p.dtype() == DType::F32 || p.dtype() == DType::F64
                             : p.dtype() == DType::F32;
  if (!supported_dtype || !p.is_contiguous()) {
    fail(describe(group, index), " is not supported; ", name_,
         " updates contiguous f32 or f64 tensors on the CPU and contiguous f32 tensors on CUDA "
         "(keep f32 master weights: bf16-mixed computes in bf16 from them, and a sharded "
         "strategy's --weights-dtype gives the optimizer f32 masters of 16-bit weights)");
  }
  Tensor grad = p.grad();
  if (!grad.defined()) return grad;
  if (grad.dtype() != p.dtype() || !(grad.device() == p.device()) || grad.shape() != p.shape()) {
    fail(describe(group, index), " has a gradient ", grad.str(),
         "; expected the parameter's dtype, device and shape");
  }
  if (grad.is_contiguous()) return grad;
  NoGradGuard no_grad;
  return grad.contiguous();
}

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> out;
  out["step_count"] = Tensor::from_vector<int64_t>({step_count_}, {});
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::string prefix = "param_groups." + std::to_string(g) + ".";
    out[prefix + "lr"] = scalar_f64(groups_[g].lr);
    out[prefix + "weight_decay"] = scalar_f64(groups_[g].weight_decay);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      std::map<std::string, Tensor> named;
      export_param_state(groups_[g].params[i], named);
      for (const auto& [name, tensor] : named) {
        if (!tensor.storage()->materialized()) {
          fail(describe(g, i), ": its ", name, " is not in memory (NVMe offload keeps the "
               "optimizer state in its swap file between steps); saving optimizer state under "
               "NVMe offload is not supported yet");
        }
      }
      std::string state_prefix = "state." + std::to_string(g) + "." + std::to_string(i) + ".";
      for (auto& [name, tensor] : named)
        out[state_prefix + name] = tensor;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  NoGradGuard no_grad;
  for (const auto& [key, value] : state) {
    if (key == "step_count") {
      step_count_ = static_cast<int64_t>(read_scalar(key, value));
      continue;
    }
    size_t group = 0;
    size_t index = 0;
    std::string name;
    if (key.rfind("param_groups.", 0) == 0) {
      std::string rest = key.substr(std::string("param_groups.").size());
      size_t dot = rest.find('.');
      std::string field = dot == std::string::npos ? "" : rest.substr(dot + 1);
      try {
        group = std::stoul(rest.substr(0, dot));
      } catch (const std::exception&) {
        tag::kOptim.fail(name_, ": load_state_dict: malformed key ", key);
      }
      if (group >= groups_.size()) {
        tag::kOptim.fail(name_, ": load_state_dict: ", key, " names group ", group,
                         " but the optimizer has ", groups_.size(), " groups");
      }
      if (field == "lr") {
        groups_[group].lr = read_scalar(key, value);
      } else if (field == "weight_decay") {
        groups_[group].weight_decay = read_scalar(key, value);
      } else {
        tag::kOptim.fail(name_, ": load_state_dict: unknown key ", key);
      }
      continue;
    }
    if (!parse_state_key(key, group, index, name)) {
      tag::kOptim.fail(name_, ": load_state_dict: unknown key ", key,
                       "; expected step_count, param_groups.<g>.<field> or state.<g>.<i>.<name>");
    }
    if (group >= groups_.size() || index >= groups_[group].params.size()) {
      tag::kOptim.fail(name_, ": load_state_dict: ", key,
                       " names a parameter this optimizer does not have");
    }
    const Tensor& param = groups_[group].params[index];
    if (!value.defined() || !value.device().is_cpu()) {
      tag::kOptim.fail(name_, ": load_state_dict: ", key, " must be a defined CPU tensor");
    }
    if (!import_param_state(param, name, value)) {
      tag::kOptim.fail(name_, ": load_state_dict: unknown state entry ", key);
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    check_group(g);
  check_loaded_state();
}

Tensor Optimizer::new_state(const Tensor& param) {
  Tensor state = Tensor::zeros(param.shape(), param.dtype(), param.device());
  state.storage()->set_kind(state_kind_for(param));
  return state;
}

Tensor Optimizer::state_copy(const Tensor& param, const Tensor& like) {
  Tensor state = like.clone();
  state.storage()->set_kind(state_kind_for(param));
  return state;
}

}  // namespace loom::optim
