#include "tensor/autocast.h"

#include <map>
#include <memory>
#include <vector>

#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/dispatch.h"

namespace loom {

// Note [Autocast's weight cache]
// PyTorch's autocast caches the casts of leaf tensors that require a gradient for as long as the
// outermost autocast region lasts, so a weight used twice in one forward is cast once. Loom's
// cache takes its scope from the caller instead (WeightCastScope): train_gpt holds one over a
// step's micro-batches, so with gradient accumulation and activation checkpointing (whose
// recomputation runs in the backward, outside the forward's region) a weight is cast once per
// step, not twice per micro-batch (Megatron-LM and DeepSpeed keep 16-bit weights for the same
// reason). An entry is keyed by the parameter's storage and the view's geometry; the scope holds
// the parameters' storages, so no other storage takes their addresses while it lasts. The cast is
// made without recording; each use gets a new view of it and its own "Cast" node, so each use
// has its own place in the graph, as when casting each time, and the graphs of successive
// micro-batches, which free their nodes after their backward, share none. The node hands the
// gradient back as it is: through the parameter's views (dtype-blind) it reaches
// AccumulateGrad, which takes an f32 one as it is or adds it, and widens a 16-bit one (from an
// op that does not write f32 weight gradients, below) while adding (add_ of f32 and bf16 in one
// pass); the values are those of casting first, since widening is exact.
//
// Note [Weight gradients in f32]
// A cast from f32 to 16 bits (cast(), or a cached cast here) takes its gradient in f32 as well
// as in 16 bits (autograd::accept_wider_gradient) and passes an f32 one on as it is; the ops
// whose weight operand is such a cast write that operand's gradient in f32 from their f32 sums
// (matmul's vjp for a 2-D right operand, linear's for its weight and bias, bias_gelu's for its
// bias) instead of rounding it to 16 bits for the cast's backward or AccumulateGrad to widen:
// a pass per weight and bias gradient fewer (8 launches per GPT-2 layer), and the gradient is
// the unrounded sum. Cached or not, the bits are the same, so the strategies that gather their
// parameters per use (no cache) keep DDP's. That departs from PyTorch's autocast, whose weight
// gradients are 16-bit products widened by the cast's backward, by at most 16-bit rounding of
// each gradient element (2^-9 relative in bf16); Megatron-LM's gradient-accumulation fusion
// writes its weight gradients in f32 the same way. Activations' gradients keep their dtype.
//
// With a WeightCastPlan, the first cast of a scope casts every view the plan holds (the previous
// step's casts) in one launch (detail::cast_each: the bits of casting each alone), and the
// scope's end leaves its casts in the plan. A transposed view is cast through its contiguous
// transpose, as cast_in_layout casts it.
struct WeightCastScope::State {
  struct Key {
    const Storage* storage;
    int64_t offset;
    Shape shape, strides;
    DType dtype;
    auto operator<=>(const Key&) const = default;
  };
  std::map<const Storage*, Tensor> parameters;  // held: addresses stay theirs
  std::map<Key, Tensor> casts;
  WeightCastPlan* plan = nullptr;
  bool plan_cast = false;  // the plan's views were cast (at the scope's first cast)

  // The plan's views of this scope's parameters in `low`, cast together into the cache.
  void cast_the_plan(DType low);
};

namespace {
thread_local DType active = DType::F32;

// x in `low`, in x's layout where x is a transposed matrix: its base cast in one contiguous
// pass and seen through the same transpose, as PyTorch's .to() preserves a dense tensor's
// strides. The products take transposed operands as they are, and give a transposed operand's
// gradient in its layout (matmul), which then reaches the weight contiguous. Recorded as one
// cast, which takes its gradient in x's dtype as cast() does (Note [Weight gradients in f32]).
Tensor cast_in_layout(const Tensor& x, DType low) {
  if (!detail::is_transposed_matrix(x)) return cast(x, low);
  Tensor out;
  {
    NoGradGuard no_grad;
    out = transpose(cast(transpose(x, 0, 1), low), 0, 1);
  }
  detail::record_cast(x, out);
  return out;
}
thread_local WeightCastScope::State* active_cache = nullptr;

// x (f32) in `low` from the active weight cache; undefined when x is not a cached parameter.
Tensor cached_cast(const Tensor& x, DType low) {
  WeightCastScope::State* cache = active_cache;
  if (cache == nullptr || !cache->parameters.count(x.storage().get())) return Tensor();
  if (cache->plan != nullptr && !cache->plan_cast) cache->cast_the_plan(low);
  const WeightCastScope::State::Key key{x.storage().get(), x.offset(), x.shape(), x.strides(),
                                        low};
  auto it = cache->casts.find(key);
  if (it == cache->casts.end()) {
    NoGradGuard no_grad;
    it = cache->casts.emplace(key, cast_in_layout(x, low)).first;
  }
  const Tensor& once = it->second;
  Tensor use = Tensor::make_view(once, once.shape(), once.strides(), once.offset());
  if (autograd::any_requires_grad({x})) {
    // The gradient goes back as it comes, f32 from the products that write it so, else in
    // the low dtype: x is a parameter or a view of one, whose accumulation widens it in the
    // same pass as the add (AccumulateGrad), where casting here would cost a pass of its own.
    autograd::record("Cast", {x}, {use}, [](const std::vector<Tensor>& g, const autograd::Node&) {
      return std::vector<Tensor>{g[0]};
    });
    autograd::accept_wider_gradient(use, x.dtype());  // Note [Weight gradients in f32]
  }
  return use;
}
}  // namespace

// A view is skipped when its parameter is not this scope's or its storage is too small for it
// (the parameter changed shape), or when it is neither contiguous nor a transposed matrix: it
// is cast at its first use, as without a plan.
void WeightCastScope::State::cast_the_plan(DType low) {
  plan_cast = true;
  std::vector<Key> keys;
  std::vector<Tensor> sources;
  std::vector<bool> transposed;
  for (const WeightCastPlan::View& v : plan->views_) {
    const std::shared_ptr<Storage> storage = v.storage.lock();
    if (!storage || v.dtype != low) continue;
    auto parameter = parameters.find(storage.get());
    if (parameter == parameters.end()) continue;
    int64_t last = v.offset;  // the view's last element
    for (size_t d = 0; d < v.shape.size(); ++d)
      last += (v.shape[d] - 1) * v.strides[d];
    if (numel_of(v.shape) == 0 || v.offset < 0 ||
        static_cast<size_t>(last + 1) * dtype_size(DType::F32) > storage->nbytes())
      continue;
    const Tensor view = Tensor::make_view(parameter->second, v.shape, v.strides, v.offset);
    const bool is_transposed = detail::is_transposed_matrix(view);
    const Tensor source = is_transposed ? transpose(view, 0, 1) : view;
    if (!source.is_contiguous()) continue;
    keys.push_back({storage.get(), v.offset, v.shape, v.strides, low});
    sources.push_back(source);
    transposed.push_back(is_transposed);
  }
  NoGradGuard no_grad;
  const std::vector<Tensor> cast = detail::cast_each(sources, low);
  for (size_t i = 0; i < keys.size(); ++i)
    casts.emplace(keys[i], transposed[i] ? transpose(cast[i], 0, 1) : cast[i]);
}

WeightCastScope::WeightCastScope(const std::vector<Tensor>& parameters, WeightCastPlan* plan)
    : state_(std::make_unique<State>()), previous_(active_cache) {
  for (const Tensor& p : parameters) {
    if (!p.defined() || p.dtype() != DType::F32) continue;
    state_->parameters.emplace(p.storage().get(), p);
  }
  state_->plan = plan;
  active_cache = state_.get();
}

WeightCastScope::~WeightCastScope() {
  active_cache = previous_;
  if (state_->plan == nullptr) return;
  try {
    std::vector<WeightCastPlan::View> views;
    for (const auto& [key, cast] : state_->casts) {
      const Tensor& parameter = state_->parameters.at(key.storage);
      views.push_back({parameter.storage(), key.offset, key.shape, key.strides, key.dtype});
    }
    state_->plan->views_ = std::move(views);
  } catch (...) {  // out of memory: the next scope casts at first use, as without a plan
    state_->plan->views_.clear();
  }
}

size_t WeightCastScope::cached_casts() const {
  return state_->casts.size();
}

AutocastGuard::AutocastGuard(DType dtype) : previous_(active) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) {
    fail("AutocastGuard: expected bf16, f16 or f32, got ", dtype);
  }
  active = dtype;
}

AutocastGuard::~AutocastGuard() {
  active = previous_;
}

DType autocast_dtype() {
  return active;
}

Tensor round_through(const Tensor& x, DType dtype) {
  if (dtype == DType::F32 || !x.defined() || x.dtype() != DType::F32) return x;
  return cast(cast(x, dtype), DType::F32);
}

Tensor autocast_emulated_input(const Tensor& x, DType low) {
  if (!x.defined()) return x;
  if (x.dtype() == low) return cast(x, DType::F32);
  return round_through(x, low);
}

Tensor autocast_input(const Tensor& x, DType low) {
  if (!x.defined() || (x.dtype() != DType::F32 && x.dtype() != low)) return x;
  const bool computes_in_low = takes_cuda_path(x.device()) || low == DType::BF16;
  if (!computes_in_low) return autocast_emulated_input(x, low);
  if (x.dtype() == low) return x;
  const Tensor cached = cached_cast(x, low);
  return cached.defined() ? cached : cast_in_layout(x, low);
}

Tensor autocast_output(const Tensor& y, DType low) {
  return y.dtype() == low ? y : cast(y, low);
}

Tensor autocast_f32_input(const Tensor& x) {
  if (active == DType::F32 || !x.defined() || !is_16bit_float(x.dtype()))
    return x;
  return cast(x, DType::F32);
}

}  // namespace loom
