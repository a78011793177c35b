#pragma once
// Strategy: how a training loop's model, optimizer and collectives are spread over devices
// and processes (Lightning's Strategy). Life cycle, as in the seeds:
//   setup_environment()  join or launch the ranks, create the process group
//   setup_module(m)      broadcast / wrap the module for this strategy
//   setup_optimizer(o)   (sharded strategies shard the state here)
//   forward_backward(f)  the loss of a batch and its backward (dp runs f per replica)
//   backward(loss)       loss.backward() plus whatever gradient sync the strategy needs
//   optimizer_step(o)    the update
//   all_reduce / all_gather / broadcast / barrier   collectives on user tensors
//   save_checkpoint / load_checkpoint, teardown()
//
// Precision (StrategyOptions::precision): the policies of strategies/precision.h, applied
// to the forward of forward_backward.

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/environment.h"
#include "comm/process_group.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "strategies/devices.h"
#include "strategies/local_launch.h"
#include "strategies/parameter_parts.h"
#include "strategies/plugins.h"
#include "strategies/precision.h"

namespace loom::strategies {

// What every strategy reads. A strategy's own options (DDP's buckets, the sharding engine's
// stage, the pipeline's stages) live with it, and the registry's StrategyConfig
// (strategies/registry.h) gathers them for front ends that choose a strategy by name.
struct StrategyOptions {
  std::string accelerator = "auto";  // cpu, cuda, auto
  std::string devices = "auto";      // "auto", "N", "-1" (all), "0,2"
  int num_nodes = 1;
  std::string precision = "32-true";
  // Backend of the process group (Lightning's process_group_backend): "auto" is "nccl" for
  // the cuda accelerator when every local rank has its own GPU and Loom was built with NCCL,
  // "hierarchical" for a group across hosts, otherwise "shm" (which stages CUDA tensors
  // through pinned host memory); comm::resolve_auto_backend decides.
  std::string process_group_backend = "auto";
  loom::Duration timeout = loom::kDefaultTimeout;
  // The dynamic loss scaler of 16-mixed (DeepSpeed's fp16 section sets it).
  LossScalerOptions loss_scaler = {};
};

class Strategy {
 public:
  explicit Strategy(StrategyOptions options);
  virtual ~Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  virtual std::string name() const = 0;
  virtual void setup_environment() {}
  // Moves the module's parameters to root_device() and keeps it as the module to train. The
  // strategy refers to the module (hooks, views of its parameters) until teardown() or its
  // destruction; a module destroyed first is left alone (Module::lifetime()), but the
  // strategy must not train it any more.
  virtual void setup_module(nn::Module& module);
  virtual void setup_optimizer(optim::Optimizer&) {}
  virtual void backward(const Tensor& loss) { loss.backward(); }
  // The loss of a function of rows [row_begin, row_end) of the batch, as a mean over rows.
  using LossOfRows = std::function<Tensor(nn::Module& module, int64_t row_begin, int64_t row_end)>;
  // One forward and backward over a batch of `rows` rows: leaves the gradient of
  // scale * loss_of_rows(module, 0, rows) added to the set-up module's parameters and returns
  // the unscaled loss. The default calls loss_of_rows once on the set-up module on this thread,
  // then backward(scale != 1 ? scale * loss : loss). dp (strategies/dp/data_parallel.h) calls it
  // once per replica on its own thread with a slice of the rows, so loss_of_rows must be
  // thread-safe for distinct modules, and the loss a mean over rows.
  virtual Tensor forward_backward(const LossOfRows& loss_of_rows, int64_t rows, double scale = 1.0);
  // The same for a batch given as (inputs, targets) whose rows loss_of_rows reads: the
  // default is forward_backward(loss_of_rows, inputs.size(0), scale). A pipeline overrides
  // it, since its stages pass the micro-batches of inputs and targets along themselves and no
  // one rank can run loss_of_rows over the whole model.
  virtual Tensor train_batch(const Tensor& inputs, const Tensor& targets,
                             const LossOfRows& loss_of_rows, double scale = 1.0);
  // What some strategies need to know of the model beyond the module, given before
  // setup_module; the others ignore it. dp builds its replicas with make_replica; a pipeline
  // balancing its stages by time runs a micro-batch of sample_input (a batch of inputs).
  struct ModelRecipe {
    std::function<std::unique_ptr<nn::Module>()> make_replica;
    Tensor sample_input;
  };
  virtual void set_model_recipe(const ModelRecipe&) {}
  // Steps the optimizer, unless the loss scaler found inf/NaN gradients (16-mixed).
  virtual void optimizer_step(optim::Optimizer& optimizer);
  // 16-mixed: divides the (accumulated) gradients by the loss scale; call once per step,
  // after the last forward_backward and before clipping. A no-op otherwise.
  virtual void unscale_gradients();
  // The global norm of the gradients the optimizer will apply (after backward), and clipping
  // to max_norm by it (optim/clip_grad.h); sharded strategies compute it over their shards.
  // Collective for multi-rank strategies.
  virtual double gradient_norm(double norm_type = 2.0);
  virtual double clip_gradients(double max_norm, double norm_type = 2.0);
  // Leaves the whole parameters in the set-up module on every rank, e.g. after the last
  // step and before saving it. Sharded strategies gather them and stop sharding (set the
  // module up again to train on); the others have nothing to do. Collective.
  virtual void gather_full_module() {}
  // True when the coming optimizer_step will be skipped (16-mixed, non-finite gradients).
  bool skips_step() const { return scaler_ && scaler_->found_inf(); }
  const LossScaler* loss_scaler() const { return scaler_.get(); }
  LossScaler* loss_scaler() { return scaler_.get(); }
  // The dtype matmul/linear round to in the forward (F32 for 32-true).
  DType compute_dtype() const { return compute_dtype_; }
  // The parameters whose storage keeps their values through a step, from its first forward to
  // the optimizer step, so that autocast's weight cache may hold their casts over the step's
  // micro-batches (WeightCastScope, tensor/autocast.h; train_gpt opens one per step): the
  // set-up module's. Strategies that gather parameters per use or swap their storage (the
  // sharded ones) give none.
  virtual std::vector<Tensor> parameters_held_through_step() const;
  // Gradient accumulation: while false, backward() skips the gradient synchronisation.
  virtual void set_backward_sync(bool) {}

  virtual int rank() const { return 0; }
  virtual int world_size() const { return 1; }
  // The replica this rank belongs to and how many there are: which data a rank reads. Equal
  // to rank() and world_size() except where ranks of one replica split the model (pipeline).
  virtual int data_parallel_rank() const { return rank(); }
  virtual int data_parallel_size() const { return world_size(); }
  virtual int local_rank() const { return 0; }
  // How many of this job's ranks (or the dp strategy's replica threads) compute on this
  // machine: they share its cores (train_gpt's default --threads).
  virtual int local_world_size() const { return 1; }
  // The devices this job computes on: one per rank (world_size()), except where one process
  // drives several (dp's replicas).
  virtual int devices() const { return world_size(); }
  // The backend of the process group ("shm", "nccl", ...) once setup_environment() made one;
  // empty for strategies without one.
  virtual std::string communication_backend() const { return {}; }
  bool is_global_zero() const { return rank() == 0; }
  // The device this process computes on: the accelerator's device for local_rank().
  // set_accelerator applies the selection `devices` makes (parse_devices) to the accelerator.
  Device root_device() const { return accelerator_->device(local_rank()); }
  const Accelerator& accelerator() const { return *accelerator_; }
  void set_accelerator(std::shared_ptr<Accelerator> accelerator);
  void set_checkpoint_io(std::shared_ptr<CheckpointIO> io);
  void set_precision(std::shared_ptr<Precision> precision);

  // Collectives on user tensors (contiguous, on the root device); in place, returned for
  // convenience. Single-device strategies return the input.
  virtual Tensor all_reduce(Tensor tensor, comm::ReduceOp op = comm::ReduceOp::Avg);
  virtual Tensor all_gather(const Tensor& tensor);  // [world, ...]
  virtual Tensor broadcast(Tensor tensor, int source = 0);
  virtual void barrier() {}

  // Copies of optimizer.state_dict() for a checkpoint (sharded strategies: this rank's shard;
  // under NVMe offload read from the swap file for it).
  virtual std::map<std::string, Tensor> optimizer_state(const optim::Optimizer& optimizer);
  // Copies the whole values in `state` (name -> tensor, as state_dict() names them) into the
  // set-up module's parameters, in place (load_parameter_parts of them). Every parameter
  // must be there.
  void load_parameters(const std::map<std::string, Tensor>& state);
  // Distributed checkpoints (strategies/checkpoint/distributed_state.h; the types are in
  // parameter_parts.h). The parts of the set-up module's parameters this rank holds: every
  // parameter whole (replicating strategies), or this rank's pieces of the shards (sharded
  // ones). Between steps.
  virtual std::vector<ParameterPart> held_parameters();
  // Ranks that hold the same parts split their writing: (which of them this rank is, how
  // many there are). Replicating strategies: (rank, world size); sharded: (0, 1), or the
  // rank among the replicas of a shard under HYBRID_SHARD.
  virtual std::pair<int, int> replica_of_held() const { return {rank(), world_size()}; }
  // The whole shape of parameter `name`, whose tensor on this rank is `param` (a
  // tensor-parallel rank holds a part of it).
  virtual Shape parameter_shape(const std::string& /*name*/, const Tensor& param) const {
    return param.shape();
  }
  // The dtype checkpoints hold parameter `param` in: its own, or the master weights' where a
  // strategy keeps f32 masters of 16-bit parameters (ShardingOptions::weights_dtype).
  virtual DType parameter_dtype(const Tensor& param) const { return param.dtype(); }
  // Whether this rank writes the checkpoint state of `param` (its parts and its optimizer
  // state): a parameter several pipeline stages hold is written by one of them.
  virtual bool writes_state_of(const std::string& /*param*/) const { return true; }
  // What each tensor the optimizer updates is made of. Replicating strategies: each is a
  // whole parameter.
  virtual OptimizerLayout optimizer_layout(const optim::Optimizer& optimizer) const;
  // Fills the parts of the parameters this rank holds with values from `read`, in place.
  // Between steps; no collectives.
  virtual void load_parameter_parts(const ReadParameter& read);
  // `state` with the set-up module's parameters replaced by copies of their whole values:
  // itself, except under sharded strategies, which gather them (collective: every rank
  // calls it, between steps).
  virtual std::map<std::string, Tensor> gather_state(const std::map<std::string, Tensor>& state) {
    return state;
  }
  // Checkpoints: the module's state (and any extra tensors) as one safetensors file written
  // atomically by global rank 0; load reads it on every rank.
  virtual void save_checkpoint(const std::filesystem::path& path,
                               const std::map<std::string, Tensor>& state);
  virtual std::map<std::string, Tensor> load_checkpoint(const std::filesystem::path& path);
  // The checkpoint format "auto" picks: sharded (each rank writes its part) where every rank
  // holds only a shard of the model states, so that a full checkpoint would gather them all.
  virtual bool prefers_sharded_checkpoints() const { return false; }
  virtual void teardown() {}
  // Lines on what the strategy measured while training, for a trainer's summary (a pipeline:
  // its bubbles); empty for most. Collective: every rank calls it, rank 0 prints them.
  virtual std::vector<std::string> training_report() { return {}; }

  const StrategyOptions& options() const { return options_; }

 protected:
  StrategyOptions options_;
  nn::Module* module_ = nullptr;
  std::shared_ptr<Accelerator> accelerator_;
  DeviceSelection devices_;  // options_.devices parsed against accelerator_ (set_accelerator)
  std::shared_ptr<CheckpointIO> checkpoint_io_ = std::make_shared<SafetensorsCheckpointIO>();
  DType compute_dtype_ = DType::F32;    // autocast dtype of the forward
  std::unique_ptr<LossScaler> scaler_;  // 16-mixed only
};

// Everything on one device, one process.
class SingleDeviceStrategy : public Strategy {
 public:
  using Strategy::Strategy;
  std::string name() const override { return "single_device"; }
};

// Several processes with a process group (from loomrun/torchrun/Slurm/MPI variables).
class ParallelStrategy : public Strategy {
 public:
  using Strategy::Strategy;
  void setup_environment() override;
  int rank() const override;
  int world_size() const override;
  int local_rank() const override;
  int local_world_size() const override;
  Tensor all_reduce(Tensor tensor, comm::ReduceOp op = comm::ReduceOp::Avg) override;
  Tensor all_gather(const Tensor& tensor) override;
  Tensor broadcast(Tensor tensor, int source = 0) override;
  void barrier() override;
  std::string communication_backend() const override;
  void teardown() override;
  ~ParallelStrategy() override;
  // Where this process sits in the job, instead of detecting it from the environment
  // variables (comm/environment.h); used by setup_environment().
  void set_cluster_environment(comm::ClusterEnv environment) {
    environment_ = std::move(environment);
  }
  // Lets tests and embedding programs hand in an existing group instead of init().
  void set_process_group(std::shared_ptr<comm::ProcessGroup> group) { group_ = std::move(group); }
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return group_; }

 protected:
  // setup_environment() for strategies that start their own ranks when no launcher did
  // (strategies/local_launch.h): joins the job the cluster environment describes (the one
  // handed to set_cluster_environment, else comm::detect_cluster_env's) unless it is a
  // single process, otherwise starts `devices` ranks with `method`. teardown() then waits
  // for them.
  void join_or_start_ranks(LaunchMethod method);
  // The backend this strategy's group uses: process_group_backend, "auto" resolved once
  // for this group (comm::resolve_auto_backend). Every rank must reach the same answer: ranks
  // started by a LocalJob (rank 0) and by setup_environment (the others) both ask here.
  // `job`: the ranks' layout (the launcher's, or the ranks a LocalJob starts on this host).
  std::string group_backend(const comm::ClusterEnv& job) const;
  // The process group; loom::Error naming `what` before setup_environment() made one.
  comm::ProcessGroup& group_for(const char* what) const;

  std::shared_ptr<comm::ProcessGroup> group_;
  std::optional<comm::ClusterEnv> environment_;
  std::unique_ptr<class LocalJob> job_;  // ranks this process started
};

}  // namespace loom::strategies
