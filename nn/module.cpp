#include "nn/module.h"

#include <sstream>

#include "tensor/ops.h"

namespace loom::nn {

Tensor Module::register_parameter(std::string name, Tensor value) {
  value.set_requires_grad(true);
  value.storage()->set_kind(MemoryKind::Parameters);
  parameters_.emplace_back(std::move(name), value);
  return value;
}

Tensor Module::register_buffer(Tensor value) {
  buffers_.push_back(value);
  return value;
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters()) {
    if (p.device() != device) p.set_data(p.detach().to(device));
  }
  std::vector<Tensor> buffers;
  collect_buffers(buffers);
  for (const Tensor& b : buffers) {
    if (b.device() != device) b.set_data(b.to(device));
  }
}

void Module::collect_buffers(std::vector<Tensor>& out) const {
  out.insert(out.end(), buffers_.begin(), buffers_.end());
  for (const auto& [name, child] : children_)
    child->collect_buffers(out);
}

void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, tensor] : parameters_)
    out.emplace_back(prefix + name, tensor);
  for (const auto& [name, child] : children_)
    child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, tensor] : named_parameters())
    out.push_back(tensor);
  return out;
}

int64_t Module::parameter_count() const {
  int64_t total = 0;
  for (const Tensor& p : parameters())
    total += p.numel();
  return total;
}

StateDict Module::state_dict() const {
  StateDict state;
  for (auto& [name, tensor] : named_parameters())
    state.emplace(name, tensor.detach());
  return state;
}

void Module::load_state_dict(const StateDict& state, bool strict) {
  auto named = named_parameters();
  std::vector<std::string> missing, unexpected, mismatched;
  std::map<std::string, const Tensor*> mine;
  for (auto& [name, tensor] : named)
    mine.emplace(name, &tensor);
  for (auto& [name, tensor] : named) {
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
    } else if (it->second.shape() != tensor.shape()) {
      mismatched.push_back(name + " (checkpoint " + shape_str(it->second.shape()) + ", model " +
                           shape_str(tensor.shape()) + ")");
    }
  }
  for (auto& [name, tensor] : state) {
    if (!mine.count(name)) unexpected.push_back(name);
  }
  auto list = [](const std::vector<std::string>& names) {
    std::ostringstream out;
    for (size_t i = 0; i < names.size(); ++i)
      out << (i ? ", " : "") << names[i];
    return out.str();
  };
  if (!mismatched.empty()) {
    fail("load_state_dict: shape mismatch for ", list(mismatched),
         "; the checkpoint was written for a different architecture");
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    std::ostringstream msg;
    msg << "load_state_dict: the state does not match the model";
    if (!missing.empty()) msg << "; missing: " << list(missing);
    if (!unexpected.empty()) msg << "; unexpected: " << list(unexpected);
    msg << " (pass strict=false to load a subset)";
    throw Error(msg.str());
  }
  NoGradGuard no_grad;
  for (auto& [name, tensor] : named) {
    auto it = state.find(name);
    if (it == state.end()) continue;
    Tensor target = tensor;
    copy_(target, it->second);
  }
}

}  // namespace loom::nn
