#include "optim/adamw.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "core/tags.h"
#include "kernels/cpu/optimizer_steps.h"
#include "tensor/meta.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/check.h"
#include "kernels/cuda/optimizer.h"
#include "tensor/cuda/pinned.h"
#include "tensor/ops/cuda_support.h"
#endif

namespace loom::optim {

namespace {

// FLOPs per element as the meta device counts them: moments, corrections, decay, update.
constexpr double kAdamWFlops = 12;

const AdamWOptions& checked(const AdamWOptions& o) {
  if (!(std::isfinite(o.lr) && o.lr >= 0.0)) tag::kOptim.fail("AdamW: invalid lr ", o.lr);
  if (!(o.beta1 >= 0.0 && o.beta1 < 1.0)) {
    tag::kOptim.fail("AdamW: invalid beta1 ", o.beta1, "; expected 0 <= beta1 < 1");
  }
  if (!(o.beta2 >= 0.0 && o.beta2 < 1.0)) {
    tag::kOptim.fail("AdamW: invalid beta2 ", o.beta2, "; expected 0 <= beta2 < 1");
  }
  if (!(std::isfinite(o.eps) && o.eps >= 0.0)) tag::kOptim.fail("AdamW: invalid eps ", o.eps);
  if (!(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0)) {
    tag::kOptim.fail("AdamW: invalid weight_decay ", o.weight_decay);
  }
  return o;
}

}  // namespace

// Note [Capturable AdamW]: one slot of kSlotBytes per (group, batch of the group's update), in
// pinned host memory and on the device.
struct AdamW::ScalarSlots {
#if LOOM_WITH_CUDA
  static constexpr size_t kSlotBytes = 64;  // AdamWScalars<double>: 8 doubles
  static constexpr int kSlots = 64;
  explicit ScalarSlots(Device device)
      : host(kSlots * kSlotBytes),
        device_bytes(Tensor::empty({int64_t{kSlots} * int64_t{kSlotBytes}}, DType::U8, device)) {}

  // Where batch `ordinal` of `group` reads its scalars: `scalars` written to the pinned slot
  // and, unless `copy` is false, copied to the device slot on `stream`. Outside a capture it
  // first waits for `stream`, whose earlier copy (or replay) may still read the slot.
  const void* stage(const ParamGroup& group, int ordinal, const void* scalars, size_t bytes,
                    bool copy, cudaStream_t stream) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    LOOM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
    if (capture == cudaStreamCaptureStatusNone) LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto it = index.try_emplace({&group, ordinal}, static_cast<int>(index.size())).first;
    if (it->second >= kSlots) {
      tag::kOptim.fail("AdamW (capturable): more than ", kSlots,
                       " fused update batches per step; use fewer parameter groups");
    }
    const size_t offset = static_cast<size_t>(it->second) * kSlotBytes;
    check(bytes <= kSlotBytes, "AdamW: scalars larger than a slot");
    std::memcpy(static_cast<char*>(host.get()) + offset, scalars, bytes);
    char* device_slot = static_cast<char*>(device_bytes.raw_data()) + offset;
    if (copy) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(device_slot, static_cast<char*>(host.get()) + offset, bytes,
                                      cudaMemcpyHostToDevice, stream));
    }
    return device_slot;
  }

  cuda::PinnedBuffer host;
  Tensor device_bytes;
  std::map<std::pair<const ParamGroup*, int>, int> index;
#endif
};

AdamW::~AdamW() = default;

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : Optimizer(with_defaults(std::move(groups), checked(options).lr, options.weight_decay),
                "AdamW"),
      options_(options) {}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{{.params = std::move(params)}}, options) {}

AdamW::State& AdamW::advance_state(const Tensor& p) {
  State& s = state_[p.impl_ptr().get()];
  if (!s.exp_avg.defined()) {
    s.param = p;
    s.exp_avg = new_state(p);
    s.exp_avg_sq = new_state(p);
  }
  ++s.step;
  return s;
}

void AdamW::update_group(const ParamGroup& group, const std::vector<Tensor>& all_params,
                         const std::vector<Tensor>& all_grads) {
  // A simulated GPU rank (meta following CUDA's path, tensor/meta.h) reports what the fused
  // launches below would cost: one op per step count over all its tensors, not one per tensor.
  struct MetaBatch {
    double flops = 0;
    std::vector<Tensor> reads, writes;
  };
  std::map<int64_t, MetaBatch> simulated;
  std::vector<Tensor> params, grads;  // the others
  for (size_t i = 0; i < all_params.size(); ++i) {
    const Tensor& p = all_params[i];
    if (!p.device().is_meta() || !takes_cuda_path(p.device())) {
      params.push_back(p);
      grads.push_back(all_grads[i]);
      continue;
    }
    State& s = advance_state(p);
    MetaBatch& batch = simulated[s.step];
    batch.flops += kAdamWFlops * double(p.numel());
    batch.reads.insert(batch.reads.end(), {p, all_grads[i], s.exp_avg, s.exp_avg_sq});
    batch.writes.insert(batch.writes.end(), {p, s.exp_avg, s.exp_avg_sq});
  }
  for (const auto& [step, batch] : simulated) {
    if (reports_op_cost(batch.reads[0].device()))
      record_meta_op("adamw", OpClass::Optimizer, batch.flops, batch.reads, batch.writes);
  }
#if LOOM_WITH_CUDA
  // One fused launch per (device, step count): parameters that missed updates for lack of
  // a gradient have their own bias corrections.
  struct Batch {
    Tensor first;  // gives the device and its stream
    std::vector<kernels::cuda::AdamWTensor> tensors;
  };
  std::map<std::pair<int, int64_t>, Batch> batches;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    if (!p.device().is_cuda()) {
      update(group, p, grads[i]);
      continue;
    }
    State& s = advance_state(p);
    Batch& batch = batches[{p.device().index, s.step}];
    if (batch.tensors.empty()) batch.first = p;
    batch.tensors.push_back({p.raw_data(), grads[i].raw_data(), s.exp_avg.raw_data(),
                             s.exp_avg_sq.raw_data(), p.numel()});
  }
  int ordinal = 0;
  for (const auto& [key, batch] : batches) {
    const kernels::cuda::AdamWArgs args{.lr = group.lr,
                                        .beta1 = options_.beta1,
                                        .beta2 = options_.beta2,
                                        .eps = options_.eps,
                                        .weight_decay = group.weight_decay,
                                        .step = key.second};
    const cudaStream_t stream = detail::stream_of(batch.first);
    const void* device_scalars = nullptr;
    if (capturable_) {
      if (!slots_) slots_ = std::make_unique<ScalarSlots>(batch.first.device());
      unsigned char scalars[ScalarSlots::kSlotBytes];
      const size_t bytes = kernels::cuda::adamw_scalars_bytes(DType::F32);
      kernels::cuda::write_adamw_scalars(DType::F32, args, scalars);
      device_scalars =
          slots_->stage(group, ordinal++, scalars, bytes, !preparing_replay_, stream);
    }
    if (preparing_replay_) continue;
    const float* grad_scale = nullptr;
    if (grad_scale_.defined()) {
      if (grad_scale_.dtype() != DType::F32 || grad_scale_.numel() != 1 ||
          grad_scale_.device() != batch.first.device()) {
        tag::kOptim.fail("AdamW: the gradient scale is ", grad_scale_.str(),
                         "; expected one f32 value on ", batch.first.device());
      }
      grad_scale = grad_scale_.data<float>();
    }
    kernels::cuda::multi_tensor_adamw(DType::F32, batch.tensors.data(),
                                      static_cast<int>(batch.tensors.size()), args, grad_scale,
                                      stream, device_scalars);
  }
#else
  Optimizer::update_group(group, params, grads);
#endif
}

void AdamW::prepare_replay() {
  if (!capturable_) tag::kOptim.fail("AdamW::prepare_replay without set_capturable(true)");
  preparing_replay_ = true;
  try {
    step();
  } catch (...) {
    preparing_replay_ = false;
    throw;
  }
  preparing_replay_ = false;
}

void AdamW::update(const ParamGroup& group, const Tensor& p, const Tensor& grad) {
  check(!p.device().is_cuda(),
        "AdamW::update runs the CPU kernel; CUDA parameters go through "
        "update_group()");
  if (preparing_replay_ || grad_scale_.defined()) {
    tag::kOptim.fail("AdamW: ", p.str(), " is not on a CUDA device; prepare_replay() and "
                     "set_grad_scale() are for CUDA parameters (a step a CUDA graph captures)");
  }
  State& s = advance_state(p);
  if (reports_op_cost(p.device())) {
    record_meta_op("adamw", OpClass::Optimizer, kAdamWFlops * double(p.numel()),
                   {p, grad, s.exp_avg, s.exp_avg_sq}, {p, s.exp_avg, s.exp_avg_sq});
  }
  if (p.device().is_meta()) {
    return;
  }
  const kernels::cpu::AdamWStepArgs args{.lr = group.lr,
                                         .beta1 = options_.beta1,
                                         .beta2 = options_.beta2,
                                         .eps = options_.eps,
                                         .weight_decay = group.weight_decay,
                                         .step = s.step};
  if (p.dtype() == DType::F32) {
    kernels::cpu::adamw_step<float>(p.data<float>(), grad.data<float>(), s.exp_avg.data<float>(),
                                    s.exp_avg_sq.data<float>(), p.numel(), args);
  } else {
    kernels::cpu::adamw_step<double>(p.data<double>(), grad.data<double>(),
                                     s.exp_avg.data<double>(), s.exp_avg_sq.data<double>(),
                                     p.numel(), args);
  }
}

bool AdamW::has_state(const Tensor& param) const {
  return param.defined() && state_.count(param.impl_ptr().get()) != 0;
}

const AdamW::State& AdamW::state_of(const Tensor& param) const {
  auto it = param.defined() ? state_.find(param.impl_ptr().get()) : state_.end();
  if (it == state_.end()) {
    tag::kOptim.fail("AdamW: no state for ", param.str(),
                     "; state is created at a parameter's first update");
  }
  return it->second;
}

const Tensor& AdamW::exp_avg(const Tensor& param) const {
  return state_of(param).exp_avg;
}
const Tensor& AdamW::exp_avg_sq(const Tensor& param) const {
  return state_of(param).exp_avg_sq;
}
int64_t AdamW::param_step(const Tensor& param) const {
  return state_of(param).step;
}

void AdamW::export_param_state(const Tensor& param, std::map<std::string, Tensor>& named) const {
  if (!has_state(param)) return;
  const State& s = state_of(param);
  named["exp_avg"] = s.exp_avg;
  named["exp_avg_sq"] = s.exp_avg_sq;
  named["step"] = Tensor::from_vector<int64_t>({s.step}, {});
}

bool AdamW::import_param_state(const Tensor& param, const std::string& name, const Tensor& value) {
  State& s = state_[param.impl_ptr().get()];
  s.param = param;
  if (name == "step") {
    if (value.numel() != 1) tag::kOptim.fail("AdamW: load_state_dict: step must be a scalar");
    s.step = static_cast<int64_t>(value.item());
    return true;
  }
  if (name != "exp_avg" && name != "exp_avg_sq") return false;
  if (value.dtype() != param.dtype() || value.shape() != param.shape()) {
    tag::kOptim.fail("AdamW: load_state_dict: ", name, " is ", value.str(),
                     " but the parameter is ", param.str());
  }
  (name == "exp_avg" ? s.exp_avg : s.exp_avg_sq) = state_copy(param, value);
  return true;
}

void AdamW::check_loaded_state() const {
  for (const auto& [key, s] : state_) {
    if (!s.exp_avg.defined() || !s.exp_avg_sq.defined() || s.step <= 0) {
      tag::kOptim.fail("AdamW: load_state_dict: incomplete state for ", s.param.str(),
                       "; expected exp_avg, exp_avg_sq and a positive step");
    }
  }
}

}  // namespace loom::optim
