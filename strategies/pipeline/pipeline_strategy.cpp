#include "strategies/pipeline/pipeline_strategy.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"
#include "core/tags.h"
#include "optim/clip_grad.h"
#include "strategies/parameter_sync.h"
#include "strategies/pipeline/partition.h"
#include "strategies/tp/model_parallel_strategy.h"
#include "tensor/ops.h"

namespace loom::strategies {

PipelineStrategy::PipelineStrategy(StrategyOptions options, pipeline::PipelineOptions pipeline,
                                   TensorParallelOptions tensor_parallel)
    : ParallelStrategy(std::move(options)),
      pipeline_(std::move(pipeline)),
      tp_options_(tensor_parallel) {
  const pipeline::PipelineOptions& o = pipeline_;
  if (o.stages < 1) tag::kPipeline.fail("--pp must be >= 1, got ", o.stages);
  if (o.micro_batches < 1)
    tag::kPipeline.fail("--micro-batches must be >= 1, got ", o.micro_batches);
  schedule_ = pipeline::ScheduleRegistry::create(o.schedule, o.chunks);
  if (o.data_parallel != "ddp" && o.data_parallel != "deepspeed_stage_1") {
    tag::kPipeline.fail("unknown data parallelism '", o.data_parallel,
                        "' inside the stages; "
                        "expected ddp or deepspeed_stage_1");
  }
  if (tp_options_.sequence_parallel) {
    tag::kPipeline.fail(
        "sequence parallelism inside a pipeline is not built; use it with "
        "model_parallel (--tp without --pp)");
  }
  if (o.data_parallel == "deepspeed_stage_1" && tp_options_.size > 1) {
    tag::kPipeline.fail("deepspeed_stage_1 inside the stages with --tp is not built; use ddp");
  }
}

void PipelineStrategy::setup_environment() {
  join_or_start_ranks(LaunchMethod::Spawn);
  const int pp = pipeline_.stages;
  const int tp = tp_options_.size;
  const int dp = DeviceMesh::data_parallel_size(group_->size(), pp, tp);
  mesh_.emplace(group_, DeviceMesh::Dims{{"dp", dp}, {"pp", pp}, {"tp", tp}});
  stage_ = mesh_->coordinate("pp");
  make_links();
}

const DeviceMesh& PipelineStrategy::mesh() const {
  if (!mesh_) tag::kPipeline.fail("the mesh exists after setup_environment()");
  return *mesh_;
}

// Splits of the pp group, one 2-rank group per link and direction: activations and
// gradients, each over the links between even and odd neighbour pairs (a stage is in two
// links, one of each parity; the lower stage is rank 0), and for interleaved schedules the
// link from the last stage back to the first (the last stage is rank 0).
void PipelineStrategy::make_links() {
  const auto& pp = mesh_->group("pp");
  const int p = pp->size(), s = stage_;
  std::shared_ptr<comm::ProcessGroup> link[2][2];  // [activations/gradients][parity]
  for (int kind = 0; kind < 2; ++kind) {
    for (int parity = 0; parity < 2; ++parity) {
      // Link l joins stages l and l + 1; this split holds the links of one parity. Every
      // stage's (color, key) is known, so a simulated group splits too (split_by).
      link[kind][parity] = pp->split_by([p, parity](int stage) {
        const int l = (stage - parity) % 2 == 0 ? stage : stage - 1;  // its link of this parity
        const bool member = l >= 0 && l + 1 < p && (l % 2) == parity;
        return std::pair{member ? l : -1, stage};
      });
    }
  }
  if (s + 1 < p) {
    links_.activations_to_next = {link[0][s % 2], 1};
    links_.gradients_from_next = {link[1][s % 2], 1};
  }
  if (s > 0) {
    links_.activations_from_prev = {link[0][(s - 1) % 2], 0};
    links_.gradients_to_prev = {link[1][(s - 1) % 2], 0};
  }
  if (schedule_->chunks_per_stage() > 1 && p > 1) {
    const auto wrap = [p](int stage) {  // the last stage, then the first
      return std::pair{stage == 0 || stage == p - 1 ? 0 : -1, stage == p - 1 ? 0 : 1};
    };
    links_.activations_wrap = {pp->split_by(wrap), s == p - 1 ? 1 : 0};
    links_.gradients_wrap = {pp->split_by(wrap), s == p - 1 ? 1 : 0};
  }
}

void PipelineStrategy::setup_module(nn::Module& module) {
  if (!mesh_) tag::kPipeline.fail("setup_module before setup_environment(): no process group");
  const auto* layered = dynamic_cast<const nn::LayeredModel*>(&module);
  if (layered == nullptr) {
    tag::kPipeline.fail(
        "the module is not an nn::LayeredModel (a model that runs as consecutive "
        "layers, as nn::GPT does); a pipeline cannot split it");
  }
  Strategy::setup_module(module);
  verify_same_parameters(module.named_parameters(), *group_);
  if (tp_options_.size > 1) {  // pp x tp: each stage's layers split over its tp group
    auto* split = dynamic_cast<nn::TensorParallelModel*>(&module);
    if (split == nullptr) {
      tag::kPipeline.fail(
          "--tp needs an nn::TensorParallelModel (a model that splits its own "
          "layers, as nn::GPT does)");
    }
    tensor_parallel_ = std::make_shared<ProcessGroupTensorParallel>(mesh_->group("tp"));
    split->parallelize(tensor_parallel_);
    layout_ = TensorParallelLayout(mesh_->group("tp"), split->tensor_parallel_splits());
  }
  const int p = pipeline_.stages;
  const int chunks = p * schedule_->chunks_per_stage();  // chunk c runs on stage c % p
  if (pipeline_.balance.empty() && pipeline_.balance_by == "time") {
    // Rank 0's measurement, so that every rank cuts the model the same way.
    if (!profile_input_.defined()) {
      tag::kPipeline.fail(
          "balancing by time needs a sample micro-batch: set_profile_input() "
          "before setup_module (train_gpt gives it)");
    }
    const std::vector<int64_t> measured = pipeline::layer_forward_times(*layered, profile_input_);
    Tensor costs = Tensor::from_vector(measured, {static_cast<int64_t>(measured.size())},
                                       pipeline::host_values_device(*group_));
    group_->broadcast(costs, {.root = 0})->wait();
    bounds_ = pipeline::partition_by_cost(costs.to_vector<int64_t>(), chunks);
  } else if (pipeline_.balance_by != "parameters" && pipeline_.balance_by != "time") {
    tag::kPipeline.fail("unknown balance_by '", pipeline_.balance_by,
                        "'; expected parameters or time");
  } else {
    bounds_ = pipeline::partition_layers(*layered, module, chunks, pipeline_.balance);
  }
  params_ = module.named_parameters();
  stages_of_.clear();
  for (int c = 0; c < chunks; ++c)
    for (int64_t l = bounds_[c]; l < bounds_[c + 1]; ++l)
      for (const std::string& name : layered->layer_parameters(l))
        stages_of_[name].insert(c % p);
  tied_.clear();
  for (const auto& [name, stages] : stages_of_) {
    if (stages.size() == 1) continue;
    if (stages != std::set<int>{0, p - 1}) {
      tag::kPipeline.fail(
          "parameter ", name,
          " is used by stages other than the first and the "
          "last together; only a first/last tie (an embedding tied to the head) is supported");
    }
    tied_.push_back(name);
  }
  for (const auto& [name, p] : params_) {
    if (!stages_of_.count(name)) tag::kPipeline.fail("parameter ", name, " belongs to no layer");
  }
  // The first and the last stage of each replica sum the tied gradients.
  const bool tied = !tied_.empty();
  tie_group_ = mesh_->group("pp")->split_by([tied, p](int stage) {
    return std::pair{tied && (stage == 0 || stage == p - 1) ? 0 : -1, stage};
  });
  // Free what this stage does not use; the rest starts equal on every rank (checked above).
  for (auto& [name, param] : params_) {
    if (!holds(name)) param.storage()->release();
  }
  runner_ = std::make_unique<pipeline::StageRunner>(*layered, *schedule_, stage_, p, bounds_,
                                                    links_, root_device());
  make_reducers();
  // This stage's order of actions, the same for every batch: made and checked once.
  const int m = pipeline_.micro_batches;
  actions_ = schedule_->actions(stage_, p, m);
  pipeline::check_actions(actions_, m, schedule_->chunks_per_stage(), schedule_->name());
}

void PipelineStrategy::setup_optimizer(optim::Optimizer& optimizer) {
  std::map<const TensorImpl*, size_t> mine;
  for (size_t k = 0; k < params_.size(); ++k)
    if (holds(params_[k].first)) mine.emplace(params_[k].second.impl_ptr().get(), k);
  const bool zero1 = pipeline_.data_parallel == "deepspeed_stage_1";
  const int replica = mesh().coordinate("dp"), replicas = mesh().size("dp");
  pieces_.clear();
  for (optim::ParamGroup& group : optimizer.param_groups()) {
    std::vector<Tensor> kept;
    for (const Tensor& t : group.params) {
      auto found = mine.find(t.impl_ptr().get());
      if (found == mine.end()) continue;  // another stage's
      if (!zero1) {
        kept.push_back(t);
        continue;
      }
      // ZeRO-1: this replica's even share of the parameter's elements.
      const int64_t n = t.numel(), begin = n * replica / replicas;
      const int64_t length = n * (replica + 1) / replicas - begin;
      if (length == 0) continue;
      Tensor view = Tensor::make_view(t.detach(), {length}, {1}, t.offset() + begin);
      view.set_requires_grad(true);
      pieces_.push_back({found->second, begin, length, view});
      kept.push_back(view);
    }
    group.params = std::move(kept);
  }
}

void PipelineStrategy::optimizer_step(optim::Optimizer& optimizer) {
  if (pipeline_.data_parallel != "deepspeed_stage_1") {
    Strategy::optimizer_step(optimizer);
    return;
  }
  NoGradGuard no_grad;
  for (OptimizerPiece& piece : pieces_) {  // the averaged gradient's part
    const Tensor grad = params_[piece.param].second.grad();
    if (!grad.defined()) continue;
    const Tensor flat = grad.contiguous();
    piece.view.set_grad(Tensor::make_view(flat, {piece.length}, {1}, flat.offset() + piece.begin));
  }
  Strategy::optimizer_step(optimizer);
  // Every replica's updated part to every replica, parameter by parameter, in a fixed order.
  const auto& dp = mesh().group("dp");
  const int replicas = dp->size();
  std::vector<comm::WorkPtr> pending;
  for (auto& [name, param] : params_) {
    if (!holds(name)) continue;
    param.set_grad(Tensor());  // the optimizer's zero_grad drops its parts' gradients only
    const int64_t n = param.numel();
    for (int r = 0; r < replicas; ++r) {
      const int64_t begin = n * r / replicas, length = n * (r + 1) / replicas - begin;
      if (length == 0) continue;
      Tensor part = Tensor::make_view(param.detach(), {length}, {1}, param.offset() + begin);
      pending.push_back(dp->broadcast(part, {.root = r}));
    }
  }
  for (const comm::WorkPtr& w : pending)
    w->wait();
}

void PipelineStrategy::unscale_gradients() {
  if (!scaler_) return;
  std::vector<Tensor> held;
  for (const auto& [name, param] : params_)
    if (holds(name)) held.push_back(param);
  scaler_->unscale(held);
  // Every rank skips the step, or none: inf/NaN on any stage counts.
  Tensor found = Tensor::full({1}, scaler_->found_inf() ? 1.0 : 0.0, DType::F64,
                              pipeline::host_values_device(*group_));
  group_->allreduce(found, {.op = comm::ReduceOp::Max})->wait();
  scaler_->set_found_inf(found.item() > 0.0);
}

Tensor PipelineStrategy::forward_backward(const LossOfRows&, int64_t, double) {
  tag::kPipeline.fail(
      "a pipeline runs whole batches: call train_batch(inputs, targets) instead of "
      "forward_backward (train_gpt does)");
}

void PipelineStrategy::set_backward_sync(bool sync) {
  if (!sync) {
    tag::kPipeline.fail(
        "gradient accumulation without synchronisation (no_sync) is not built; "
        "use --micro-batches, which accumulates inside a batch");
  }
}

Tensor PipelineStrategy::train_batch(const Tensor& inputs, const Tensor& targets, double scale) {
  if (!runner_) tag::kPipeline.fail("train_batch before setup_module()");
  const int m = pipeline_.micro_batches;
  const int64_t rows = inputs.size(0);
  if (rows % m != 0) {
    tag::kPipeline.fail("a batch of ", rows, " rows does not split into --micro-batches ", m,
                        "; use a --batch that ", m, " divides");
  }
  std::vector<Tensor> in, out;
  for (int k = 0; k < m; ++k) {
    const int64_t begin = rows / m * k;
    if (runner_->has_first_chunk()) in.push_back(inputs.narrow(0, begin, rows / m).contiguous());
    if (runner_->has_last_chunk()) out.push_back(targets.narrow(0, begin, rows / m).contiguous());
  }
  // 16-mixed: the last stage's losses scaled as one device scales them; unscale_gradients
  // divides every stage's gradients back.
  const double loss_scale = scale / m * (scaler_ ? scaler_->scale() : 1.0);
  for (const auto& reducer : reducers_)
    if (reducer) reducer->bind_gradient_views();
  const double loss =
      runner_->run(actions_, m, in, out, loss_scale, compute_dtype_, [this](int chunk) {
        if (reducers_[static_cast<size_t>(chunk)]) {
          reducers_[static_cast<size_t>(chunk)]->prepare_for_backward(Tensor());
        }
      });
  synchronise_gradients();
  // Every rank reports the batch's loss: the last stage's, broadcast along the pipeline.
  const auto& pp = mesh_->group("pp");
  Tensor value = Tensor::full({1}, loss, DType::F64, pipeline::host_values_device(*pp));
  pp->broadcast(value, {.root = pipeline_.stages - 1})->wait();
  return value.reshape({});
}

Tensor PipelineStrategy::train_batch(const Tensor& inputs, const Tensor& targets,
                                     const LossOfRows& /*loss_of_rows*/, double scale) {
  return train_batch(inputs, targets, scale);
}

void PipelineStrategy::set_model_recipe(const ModelRecipe& recipe) {
  if (!recipe.sample_input.defined()) return;
  const int64_t rows =
      std::max<int64_t>(recipe.sample_input.size(0) / std::max(pipeline_.micro_batches, 1), 1);
  set_profile_input(recipe.sample_input.narrow(0, 0, rows).contiguous());
}

void PipelineStrategy::make_reducers() {
  const int p = pipeline_.stages, chunks = schedule_->chunks_per_stage();
  const auto* layered = dynamic_cast<const nn::LayeredModel*>(module_);
  // The parameters each chunk of this stage uses, and how many of its chunks use each.
  std::vector<std::set<std::string>> in_chunk(static_cast<size_t>(chunks));
  std::map<std::string, int> chunks_using;
  for (int j = 0; j < chunks; ++j) {
    const int c = j * p + stage_;
    for (int64_t l = bounds_[c]; l < bounds_[c + 1]; ++l)
      for (const std::string& name : layered->layer_parameters(l))
        in_chunk[static_cast<size_t>(j)].insert(name);
    for (const std::string& name : in_chunk[static_cast<size_t>(j)])
      ++chunks_using[name];
  }
  reduced_at_end_.clear();
  for (const std::string& name : tied_)
    if (holds(name)) reduced_at_end_.insert(name);
  for (const auto& [name, count] : chunks_using)
    if (count > 1) reduced_at_end_.insert(name);
  reducers_.clear();
  reducers_.resize(static_cast<size_t>(chunks));
  const auto& dp = mesh_->group("dp");
  if (dp->size() == 1) return;
  for (int j = 0; j < chunks; ++j) {
    std::vector<Tensor> params;
    std::vector<std::string> names;
    for (const auto& [name, param] : params_) {  // registration order, as DDP's
      if (!in_chunk[static_cast<size_t>(j)].count(name) || reduced_at_end_.count(name)) continue;
      params.push_back(param);
      names.push_back(name);
    }
    if (!params.empty())
      reducers_[static_cast<size_t>(j)] =
          std::make_unique<Reducer>(params, dp, ReducerOptions{}, names);
  }
}

// The chunks' reducers finish their buckets; then the parameters two stages tie are summed
// across them and, with those several chunks use, averaged over the stage's dp replicas. Each
// gradient element gets the same operations in the same order as before the reducers
// (2026-12-03): a tied sum first, then one average over dp.
void PipelineStrategy::synchronise_gradients() {
  for (const auto& reducer : reducers_)
    if (reducer) reducer->finalize_backward();
  NoGradGuard no_grad;
  std::vector<comm::WorkPtr> pending;
  if (tie_group_) {
    for (const std::string& name : tied_) {  // the same order on both stages
      for (auto& [n, param] : params_) {
        if (n != name) continue;
        Tensor g = param.grad();
        if (!g.defined()) g = Tensor::zeros(param.shape(), param.dtype(), param.device());
        pending.push_back(tie_group_->allreduce(g, {.op = comm::ReduceOp::Sum}));
        param.set_grad(g);
      }
    }
    for (const comm::WorkPtr& w : pending)
      w->wait();
    pending.clear();
  }
  const auto& dp = mesh_->group("dp");
  if (dp->size() == 1) return;
  for (auto& [name, param] : params_) {
    if (!reduced_at_end_.count(name)) continue;
    Tensor g = param.grad();
    if (!g.defined()) tag::kPipeline.fail("parameter ", name, " got no gradient on stage ", stage_);
    pending.push_back(dp->allreduce(g, {.op = comm::ReduceOp::Avg}));
  }
  for (const comm::WorkPtr& w : pending)
    w->wait();
}

void PipelineStrategy::teardown() {
  reducers_.clear();
  ParallelStrategy::teardown();
}

std::vector<double> PipelineStrategy::measured_bubbles() {
  const auto& pp = mesh().group("pp");
  const double mine = runner_ && runner_->total_seconds() > 0
                          ? 1.0 - runner_->busy_seconds() / runner_->total_seconds()
                          : 0.0;
  Tensor all = Tensor::zeros({pp->size()}, DType::F64, pipeline::host_values_device(*pp));
  Tensor one = Tensor::full({1}, mine, DType::F64, pipeline::host_values_device(*pp));
  pp->all_gather(all, one)->wait();
  return all.to_vector<double>();
}

double PipelineStrategy::theoretical_bubble() const {
  return schedule_->theoretical_bubble(pipeline_.stages, pipeline_.micro_batches);
}

std::vector<std::string> PipelineStrategy::training_report() {
  const std::vector<double> bubbles = measured_bubbles();
  std::string measured;
  for (double b : bubbles)
    measured += (measured.empty() ? "" : " ") + std::to_string(b).substr(0, 5);
  std::string layers;
  for (size_t c = 0; c + 1 < bounds_.size(); ++c)
    layers += (c ? "," : "") + std::to_string(bounds_[c + 1] - bounds_[c]);
  char theory[32];
  std::snprintf(theory, sizeof theory, "%.3f", theoretical_bubble());
  return {"pipeline: " + mesh().describe() + ", " + std::to_string(pipeline_.micro_batches) +
          " micro-batches, " + schedule_->name() + ", layers per chunk " + layers +
          ": bubble per stage " + measured + " (theory " + theory + ")"};
}

bool PipelineStrategy::holds(const std::string& name) const {
  return stages_of_.at(name).count(stage_) != 0;
}

int PipelineStrategy::owner_stage(const std::string& name) const {
  return *stages_of_.at(name).begin();
}

// Per-parameter norms on the owning stage, gathered along the pipeline, combined in the
// module's parameter order: what optim::grad_norm gives on one device.
double PipelineStrategy::gradient_norm(double norm_type) {
  if (!runner_) tag::kPipeline.fail("gradient_norm before setup_module()");
  std::vector<double> norms(params_.size(), 0.0);
  std::vector<std::string> names;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, param] = params_[i];
    names.push_back(name);
    if (owner_stage(name) == stage_ && param.grad().defined())
      norms[i] = optim::grad_norm({param}, norm_type);
  }
  layout_.complete_norms(names, norms, norm_type);  // parts split over this stage's tp group
  const auto& pp = mesh_->group("pp");
  Tensor all = Tensor::from_vector(norms, {static_cast<int64_t>(norms.size())},
                                   pipeline::host_values_device(*pp));
  pp->allreduce(all, {.op = comm::ReduceOp::Sum})->wait();
  return optim::total_norm(all.to_vector<double>(), norm_type);
}

double PipelineStrategy::clip_gradients(double max_norm, double norm_type) {
  const double total = gradient_norm(norm_type);
  std::vector<Tensor> mine;
  for (const auto& [name, param] : params_)
    if (holds(name)) mine.push_back(param);
  return optim::clip_grads_to_norm(mine, max_norm, total, norm_type);
}

int PipelineStrategy::data_parallel_rank() const {
  return mesh().coordinate("dp");
}

int PipelineStrategy::data_parallel_size() const {
  return mesh().size("dp");
}

std::vector<ParameterPart> PipelineStrategy::held_parameters() {
  std::vector<ParameterPart> parts;
  for (const auto& [name, param] : params_)
    if (writes_state_of(name)) layout_.add_parts(name, param, parts);
  return parts;
}

bool PipelineStrategy::writes_state_of(const std::string& param) const {
  return owner_stage(param) == stage_ && layout_.writes(param);
}

Shape PipelineStrategy::parameter_shape(const std::string& name, const Tensor& param) const {
  return whole_ ? param.shape() : layout_.whole_shape(name, param);
}

OptimizerLayout PipelineStrategy::optimizer_layout(const optim::Optimizer& optimizer) const {
  PartsByTensor parts;
  for (const auto& [name, p] : params_)
    parts[p.impl_ptr().get()] = layout_.optimizer_parts(name, p);
  // ZeRO-1: the optimizer's tensors are this replica's runs of the parameters.
  for (const OptimizerPiece& piece : pieces_) {
    OptimizerPart part{params_[piece.param].first, piece.begin, piece.length, 0};
    part.sole_holder = true;
    parts[piece.view.impl_ptr().get()] = {part};
  }
  return optimizer_layout_of(optimizer, parts, name());
}


std::pair<int, int> PipelineStrategy::replica_of_held() const {
  return {data_parallel_rank(), data_parallel_size()};
}

void PipelineStrategy::load_parameter_parts(const ReadParameter& read) {
  for (const auto& [name, param] : params_)
    if (holds(name)) layout_.load(name, param, read);
}

// Every parameter from its owner (dp rank 0 of the owning stage) to every rank.
Tensor PipelineStrategy::from_owner(const std::string& name, const Tensor& param) {
  // The holders of the owning stage put the whole value together (over their tp group), and
  // its first replica's first tp rank sends it to every rank.
  Tensor copy =
      holds(name) ? layout_.whole(name, param)
                  : Tensor::empty(layout_.whole_shape(name, param), param.dtype(), param.device());
  const int root = mesh_->rank_with({{"dp", 0}, {"pp", owner_stage(name)}, {"tp", 0}});
  group_->broadcast(copy, {.root = root})->wait();
  return copy;
}

std::map<std::string, Tensor> PipelineStrategy::gather_state(
    const std::map<std::string, Tensor>& state) {
  std::map<std::string, Tensor> whole = state;
  for (const auto& [name, param] : params_) {
    Tensor copy = whole_ ? param.detach().clone() : from_owner(name, param);
    if (whole.count(name)) whole[name] = copy;
  }
  return whole;
}

void PipelineStrategy::gather_full_module() {
  if (!runner_ || whole_) return;
  NoGradGuard no_grad;
  for (auto& [name, param] : params_)
    param.set_data(from_owner(name, param));
  whole_ = true;  // whole weights on every rank: for saving, not for training on
}

}  // namespace loom::strategies
