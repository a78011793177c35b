#include "strategies/ddp/reducer.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "core/tags.h"
#include "strategies/gradient_sync_hint.h"
#include "strategies/trace.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace loom::strategies {

struct Reducer::Bucket {
  std::vector<size_t> params;  // indices into params_, in the order they were assigned
  Tensor flat;                 // all gradients of the bucket, back to back
  size_t pending = 0;          // gradients not yet ready in this backward pass
  GradBucket view;             // what the comm hook sees: flat plus per-parameter views
  std::unique_ptr<PendingBucket> work;
  int64_t launched_us = -1;  // when its communication was launched, for the trace
};

Reducer::Reducer(std::vector<Tensor> params, std::shared_ptr<comm::ProcessGroup> group,
                 const ReducerOptions& options, std::vector<std::string> names)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      hook_(options.comm_hook == "powersgd" ? make_powersgd_hook(options.powersgd)
                                             : CommHookRegistry::create(options.comm_hook)),
      slots_(params_.size()),
      ready_(params_.size(), false),
      alive_(std::make_shared<bool>(true)) {
  check(group_ != nullptr, tag::kDdp.prefix() + "Reducer needs a process group");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.is_leaf() || !p.requires_grad() || !p.is_contiguous()) {
      tag::kDdp.fail("parameter ", name_of(i), " (", p.str(),
                     ") must be a contiguous leaf that requires grad");
    }
  }
  // Reverse registration order: the order in which backward produces the gradients.
  const double mib = 1024.0 * 1024.0;
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    double cap = (buckets_.size() <= 1 ? options_.first_bucket_mb : options_.bucket_cap_mb) * mib;
    bool fits = !buckets_.empty() &&
                params_[buckets_.back()->params.front()].dtype() == p.dtype() &&
                static_cast<double>(bytes + p.nbytes()) <= cap;
    if (!fits) {
      buckets_.push_back(std::make_unique<Bucket>());
      bytes = 0;
    }
    buckets_.back()->params.push_back(k);
    bytes += p.nbytes();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    int64_t offset = 0;
    for (size_t k : bucket.params) {
      slots_[k] = {b, offset};
      offset += params_[k].numel();
    }
    const Tensor& first = params_[bucket.params.front()];
    bucket.flat = Tensor::zeros({offset}, first.dtype(), first.device());
    bucket.flat.storage()->set_kind(options_.gradient_as_bucket_view ? MemoryKind::Gradients
                                                                      : MemoryKind::Communication);
    bucket.view.index = b;
    bucket.view.buffer = bucket.flat;
    bucket.view.is_last = b + 1 == buckets_.size();
  }
  for (auto& bucket : buckets_) {
    for (size_t k : bucket->params)
      bucket->view.gradients.push_back(slice_of(k));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    std::weak_ptr<bool> alive = alive_;
    params_[k].register_grad_ready_hook([this, alive, k](Tensor&) {
      if (alive.lock()) on_gradient_ready(k);
    });
  }
}

Reducer::~Reducer() {
  *alive_ = false;
}

std::string Reducer::name_of(size_t param) const {
  if (param < names_.size()) return names_[param];
  std::string name = "#";  // (built in two steps: GCC 12 misreports "#" + to_string as -Wrestrict)
  name += std::to_string(param);
  return name;
}

Tensor Reducer::slice_of(size_t param) const {
  const Slot& slot = slots_[param];
  const Tensor& p = params_[param];
  return Tensor::make_view(buckets_[slot.bucket]->flat, p.shape(), contiguous_strides(p.shape()),
                           slot.offset);
}

std::vector<std::vector<size_t>> Reducer::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& bucket : buckets_)
    out.push_back(bucket->params);
  return out;
}

void Reducer::prepare_for_backward(const Tensor& loss) {
  if (expecting_backward_) {
    tag::kDdp.fail("prepare_for_backward called twice without finalize_backward in between");
  }
  NoGradGuard no_grad;
  bind_gradient_views();
  if (!sync_) return;
  expecting_backward_ = true;
  next_launch_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& bucket : buckets_) {
    bucket->pending = bucket->params.size();
    bucket->work = nullptr;
  }
  if (options_.find_unused_parameters) {
    if (!options_.static_graph || !unused_known_) {
      std::vector<const TensorImpl*> used = autograd::reachable_leaves(loss);
      std::unordered_set<const TensorImpl*> reached(used.begin(), used.end());
      unused_.clear();
      for (size_t k = 0; k < params_.size(); ++k) {
        if (!reached.count(params_[k].impl_ptr().get())) unused_.push_back(k);
      }
      unused_known_ = true;
    }
    for (size_t k : unused_)
      mark_ready(k);
  }
}

void Reducer::bind_gradient_views() {
  if (!options_.gradient_as_bucket_view) return;
  NoGradGuard no_grad;
  // A parameter whose .grad was dropped (zero_grad) gets a zeroed slice; one that still holds
  // a gradient (accumulation under no_sync) keeps accumulating in place.
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor grad = params_[k].grad();
    Tensor slice = slice_of(k);
    if (!grad.defined()) {
      fill_(slice, 0.0);
      params_[k].set_grad(slice);
    } else if (grad.storage() != slice.storage() || grad.offset() != slice.offset()) {
      copy_(slice, grad);
      params_[k].set_grad(slice);
    }
  }
}

void Reducer::on_gradient_ready(size_t param) {
  if (!expecting_backward_) return;
  if (!options_.gradient_as_bucket_view) {
    NoGradGuard no_grad;
    Tensor slice = slice_of(param);
    copy_(slice, params_[param].grad());
  }
  mark_ready(param);
}

void Reducer::mark_ready(size_t param) {
  if (ready_[param]) return;  // a second hook call in one pass (e.g. recomputation)
  ready_[param] = true;
  size_t b = slots_[param].bucket;
  if (--buckets_[b]->pending == 0) {
    if (Trace* trace = current_trace()) {
      trace->instant("bucket " + std::to_string(b) + " ready", "ddp", trace->now_us(),
                     Trace::kMainThread,
                     {{"bucket", static_cast<int64_t>(b)},
                      {"bytes", static_cast<int64_t>(buckets_[b]->flat.nbytes())}});
    }
    launch_ready_buckets();
  }
}

// Note [Bucket spans in the trace]
// Each bucket's span is a communication span (Note [Communication spans in the trace] in
// strategies/trace.h), so that the overlap with backward and the communication left exposed
// after it can be read off the timeline; the default "allreduce" hook gives names like
// "bucket 0 allreduce (4096 bytes)". While a trace records, the group times its operations
// with the precise clock (Note [Operation times] in comm/process_group.cpp; it stays so
// afterwards).

// Buckets go out strictly in index order, so every rank issues the same allreduces in the
// same order even if its buckets became ready in another order.
void Reducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) {
    Bucket& bucket = *buckets_[next_launch_++];
    if (prologue_) prologue_(bucket.params, bucket.view.gradients);
    Trace* trace = current_trace();
    if (trace != nullptr) group_->time_precisely();
    bucket.launched_us = trace != nullptr ? trace->now_us() : -1;
    bucket.work = hook_->launch(bucket.view, *group_);
  }
}

void Reducer::finalize_backward() {
  if (!expecting_backward_) return;
  expecting_backward_ = false;
  if (next_launch_ < buckets_.size()) {
    for (size_t k = 0; k < params_.size(); ++k) {
      if (!ready_[k]) {
        tag::kDdp.fail(
            "parameter ", name_of(k),
            " received no gradient in this backward pass, so its bucket was never reduced; "
            "if some parameters are unused, construct DDP with find_unused_parameters=true");
      }
    }
  }
  // See Note [Bucket spans in the trace].
  Trace* trace = current_trace();
  Trace::Span wait_span(trace, "ddp wait for buckets", "ddp");
  CommLanes lanes;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    std::unique_ptr<PendingBucket> work = std::move(bucket.work);
    try {
      work->finish();
    } catch (const CommError& e) {
      throw e.rephrased(tag::kDdp.prefix() + "rank " + std::to_string(group_->rank()) +
                        ": gradient bucket " + std::to_string(b) + " was not reduced: " + e.what() +
                        skipped_backward_hint(e));
    }
    if (trace == nullptr || bucket.launched_us < 0) continue;
    record_comm_span(*trace, lanes,
                     "bucket " + std::to_string(b) + " " + options_.comm_hook + " (" +
                         std::to_string(bucket.flat.nbytes()) + " bytes)",
                     "ddp", bucket.launched_us, trace->now_us(), work->comm_span(),
                     {{"bucket", static_cast<int64_t>(b)},
                      {"bytes", static_cast<int64_t>(bucket.flat.nbytes())},
                      {"parameters", static_cast<int64_t>(bucket.params.size())}});
  }
  if (!options_.gradient_as_bucket_view) {
    NoGradGuard no_grad;
    for (size_t k = 0; k < params_.size(); ++k) {
      Tensor grad = params_[k].grad();
      if (grad.defined()) {
        copy_(grad, slice_of(k));
      } else {
        Tensor grad = slice_of(k).clone();
        grad.storage()->set_kind(MemoryKind::Gradients);
        params_[k].set_grad(grad);
      }
    }
  }
}

}  // namespace loom::strategies
