#include "optim/sgd.h"

#include <cmath>
#include <utility>

#include "core/tags.h"
#include "kernels/cpu/optimizer_steps.h"
#include "tensor/meta.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/optimizer.h"
#include "tensor/ops/cuda_support.h"
#endif

namespace loom::optim {

namespace {

const SGDOptions& checked(const SGDOptions& o) {
  if (!std::isnan(o.lr) && !(std::isfinite(o.lr) && o.lr >= 0.0)) {
    tag::kOptim.fail("SGD: invalid lr ", o.lr);
  }
  if (!(std::isfinite(o.momentum) && o.momentum >= 0.0)) {
    tag::kOptim.fail("SGD: invalid momentum ", o.momentum, "; expected >= 0");
  }
  if (!std::isfinite(o.dampening)) tag::kOptim.fail("SGD: invalid dampening ", o.dampening);
  if (!(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0)) {
    tag::kOptim.fail("SGD: invalid weight_decay ", o.weight_decay);
  }
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    tag::kOptim.fail(
        "SGD: Nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ",
        o.momentum, ", dampening ", o.dampening, ")");
  }
  return o;
}

std::vector<ParamGroup> with_required_lr(std::vector<ParamGroup> groups) {
  for (size_t g = 0; g < groups.size(); ++g) {
    if (std::isnan(groups[g].lr)) {
      tag::kOptim.fail(
          "SGD: group ", g,
          " has no learning rate; set ParamGroup::lr or SGDOptions::lr (SGD has no default)");
    }
  }
  return groups;
}

}  // namespace

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& options)
    : Optimizer(with_required_lr(
                    with_defaults(std::move(groups), checked(options).lr, options.weight_decay)),
                "SGD"),
      options_(options) {}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : SGD(std::vector<ParamGroup>{{.params = std::move(params)}}, options) {}

void SGD::update(const ParamGroup& group, const Tensor& p, const Tensor& grad) {
  const bool use_momentum = options_.momentum != 0.0;
  bool first_step = false;
  Tensor buffer;
  if (use_momentum) {
    State& s = state_[p.impl_ptr().get()];
    if (!s.momentum_buffer.defined()) {
      s.param = p;
      s.momentum_buffer = new_state(p);  // overwritten by the first step's gradient
      first_step = true;
    }
    buffer = s.momentum_buffer;
  }
  const kernels::cpu::SGDStepArgs args{.lr = group.lr,
                                       .momentum = options_.momentum,
                                       .dampening = options_.dampening,
                                       .weight_decay = group.weight_decay,
                                       .nesterov = options_.nesterov,
                                       .first_step = first_step};
  if (reports_op_cost(p.device())) {
    record_meta_op("sgd", OpClass::Optimizer, 4 * double(p.numel()),
                   {p, grad, use_momentum ? buffer : Tensor::empty({0}, p.dtype(), p.device())},
                   {p, use_momentum ? buffer : Tensor::empty({0}, p.dtype(), p.device())});
  }
  if (p.device().is_meta()) {
    // nothing to compute: the cost is reported above
  } else if (p.device().is_cuda()) {
#if LOOM_WITH_CUDA
    const kernels::cuda::SGDArgs cuda_args{.lr = args.lr,
                                           .momentum = args.momentum,
                                           .dampening = args.dampening,
                                           .weight_decay = args.weight_decay,
                                           .nesterov = args.nesterov,
                                           .first_step = args.first_step};
    kernels::cuda::sgd_step(p.dtype(), p.raw_data(), grad.raw_data(),
                            use_momentum ? buffer.raw_data() : nullptr, p.numel(), cuda_args,
                            detail::stream_of(p));
#endif
  } else if (p.dtype() == DType::F32) {
    kernels::cpu::sgd_step<float>(p.data<float>(), grad.data<float>(),
                                  use_momentum ? buffer.data<float>() : nullptr, p.numel(), args);
  } else {
    kernels::cpu::sgd_step<double>(p.data<double>(), grad.data<double>(),
                                   use_momentum ? buffer.data<double>() : nullptr, p.numel(), args);
  }
}

bool SGD::has_momentum_buffer(const Tensor& param) const {
  return param.defined() && state_.count(param.impl_ptr().get()) != 0;
}

const Tensor& SGD::momentum_buffer(const Tensor& param) const {
  auto it = param.defined() ? state_.find(param.impl_ptr().get()) : state_.end();
  if (it == state_.end()) {
    tag::kOptim.fail("SGD: no momentum buffer for ", param.str(),
                     "; it is created at a parameter's first update when momentum != 0");
  }
  return it->second.momentum_buffer;
}

void SGD::export_param_state(const Tensor& param, std::map<std::string, Tensor>& named) const {
  if (has_momentum_buffer(param)) named["momentum_buffer"] = momentum_buffer(param);
}

bool SGD::import_param_state(const Tensor& param, const std::string& name, const Tensor& value) {
  if (name != "momentum_buffer") return false;
  if (value.dtype() != param.dtype() || value.shape() != param.shape()) {
    tag::kOptim.fail("SGD: load_state_dict: momentum_buffer is ", value.str(),
                     " but the parameter is ", param.str());
  }
  state_[param.impl_ptr().get()] = State{.param = param, .momentum_buffer = state_copy(param, value)};
  return true;
}

}  // namespace loom::optim
