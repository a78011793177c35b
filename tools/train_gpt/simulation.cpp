#include "tools/train_gpt/simulation.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "comm/store/in_process_store.h"
#include "core/tags.h"
#include "sim/device_model.h"
#include "sim/rank_exchange.h"
#include "sim/timeline.h"
#include "strategies/devices.h"
#include "strategies/plugins.h"
#include "strategies/registry.h"

namespace loom::train_gpt {

namespace {

using strategies::StrategyKind;

void check_simulated(const std::string& name, const strategies::StrategyConfig& config,
                     int world_size) {
  const StrategyKind kind = strategies::StrategyRegistry::entry(name).kind;
  if (kind == StrategyKind::SingleDevice && world_size != 1) {
    tag::kLoomSim.fail("--strategy ", name, " runs on 1 rank, not --world-size ", world_size);
  }
  if (kind != StrategyKind::Pipeline) return;
  const int ranks = config.pipeline.stages * config.tensor_parallel.size;
  if (ranks < 1 || world_size % ranks != 0) {
    tag::kLoomSim.fail("--world-size ", world_size, " is not a multiple of --pp x --tp = ", ranks);
  }
}

// Rank `rank` of `world_size` simulated ranks, on the calling thread (see simulate_rank); with
// an `exchange`, one of the ranks simulated together in this process.
SimulatedRank run_rank(const nn::ModelSpec& spec, const TrainOptions& options,
                       strategies::Strategy& strategy, const strategies::StrategyConfig& config,
                       int rank, int world_size, const sim::Cluster& cluster,
                       bool record_trace, sim::RankExchange* exchange) {
  const Device meta = Device::meta();
  const DType compute_dtype = sim::compute_dtype(config.precision);
  SimulatedRank out;
  out.world_size = world_size;
  out.rank = rank;
  out.cluster = cluster.name;
  out.device_memory_bytes = static_cast<int64_t>(cluster.device.memory_bytes);
  if (record_trace) out.traces.emplace_back(rank, std::make_shared<strategies::Trace>());
  sim::Timeline timeline(cluster, rank, world_size, compute_dtype,
                         record_trace ? out.traces.back().second.get() : nullptr, exchange);
  {
    sim::TimelineScope scope(timeline);
    // A GPU cluster's ranks allocate as Loom's CUDA code path does (device.code_path).
    std::optional<MetaCudaPathScope> cuda_path;
    if (cluster.device.cuda_code_path) cuda_path.emplace();
    // The rank's host work (the offloaded optimizer, on real host tensors) takes simulated time
    // too, at the cluster's host rates.
    CpuOpReports host_ops;
    strategy.set_accelerator(std::make_shared<strategies::MetaAccelerator>());
    if (auto* parallel = dynamic_cast<strategies::ParallelStrategy*>(&strategy)) {
      parallel->set_process_group(std::make_shared<comm::ProcessGroup>(
          rank, world_size, std::make_shared<comm::InProcessStore>(),
          comm::GroupOptions{.backend = "sim", .device = meta}, "simulated"));
      // The job's nodes: --devices ranks each (HYBRID_SHARD shards within one).
      const int per_node = std::min(
          world_size, strategies::parse_devices(config.devices, strategies::MetaAccelerator()).count);
      if (world_size % per_node != 0) {
        tag::kLoomSim.fail("--world-size ", world_size, " is not a multiple of --devices ",
                           per_node, " (the ranks of one node)");
      }
      comm::ClusterEnv job;
      job.source = "simulated";
      job.rank = rank;
      job.world_size = world_size;
      job.local_rank = rank % per_node;
      job.local_world_size = per_node;
      job.node_rank = rank / per_node;
      parallel->set_cluster_environment(job);
    }
    strategy.setup_environment();
    nn::ModelSpec on_meta = spec;
    on_meta.gpt.options.device = on_meta.llama.options.device = meta;
    const std::unique_ptr<nn::CausalLM> model = on_meta.build(options.seed);
    out.parameters = model->parameter_count();
    TrainOptions o = options;
    o.steps = 2;
    o.eval_every = 0;
    o.checkpoint_dir.clear();
    o.save_every = 0;
    o.resume.clear();
    // Values do not matter on meta: zeros, two batches' worth (positions wrap around).
    const int64_t time = o.model.context;
    const int64_t sequences = 2 * o.batch + 1;
    data::TokenBlocks data(std::vector<int32_t>(static_cast<size_t>(sequences * (time + 1)), 0),
                           o.batch, time, o.model.vocab_size);
    // The second step is the one reported: its compute, collectives and time, from the first
    // step's end (its metrics callback) to its own (what train() does after, such as gathering
    // a sharded model back, is not a step's).
    struct Mark {
      MetaCostTotals::Sum compute;
      double model_flops = 0;
      size_t comm = 0;
      sim::Timeline::Totals time;
    };
    Mark at_step[2];
    const MetaCostTotals& costs = timeline.costs();
    train(
        *model, data, o,
        [&](const StepMetrics& m) {
          // Peaks as train_gpt's report reads them (its own are the maximum over the ranks:
          // an allreduce, which reads as zeros here).
          const MemoryStats device = allocator_for(meta).stats();
          for (size_t k = 0; k < kMemoryKindCount; ++k)
            out.peak_bytes_by_kind[k] = static_cast<int64_t>(device.peak_by_kind[k]);
          // Offloaded buffers are on the host: real host tensors for a GPU cluster's rank, the
          // meta device itself for a CPU cluster's (ShardedEngine: a CPU rank's pool).
          const auto offloaded = static_cast<size_t>(MemoryKind::Offloaded);
          out.peak_bytes_by_kind[offloaded] += static_cast<int64_t>(
              allocator_for(Device::cpu()).stats().peak_by_kind[offloaded]);
          out.peak_bytes = static_cast<int64_t>(device.device_peak_bytes);
          at_step[m.step == 0 ? 0 : 1] = {
              .compute = costs.total(),
              .model_flops = costs.of(OpClass::Gemm).flops + costs.of(OpClass::Attention).flops,
              .comm = timeline.comm_log().size(),
              .time = timeline.totals()};
        },
        &strategy);
    const Mark &first = at_step[0], &last = at_step[1];
    out.step_s = last.time.now - first.time.now;
    out.compute_s = last.time.compute - first.time.compute;
    out.exposed_comm_s = last.time.exposed_comm - first.time.exposed_comm;
    out.bubble_s = last.time.bubble - first.time.bubble;
    out.comm_busy_s = last.time.comm_busy - first.time.comm_busy;
    out.model_flops = last.model_flops - first.model_flops;
    const double peak = timeline.device().peak_flops(compute_dtype);
    out.mfu = out.step_s > 0 ? out.model_flops / out.step_s / peak : 0;
    out.compute = {.ops = last.compute.ops - first.compute.ops,
                   .flops = last.compute.flops - first.compute.flops,
                   .bytes_read = last.compute.bytes_read - first.compute.bytes_read,
                   .bytes_written = last.compute.bytes_written - first.compute.bytes_written};
    const std::vector<comm::CommCost> all = timeline.comm_log();
    out.comm.assign(all.begin() + static_cast<std::ptrdiff_t>(first.comm),
                    all.begin() + static_cast<std::ptrdiff_t>(last.comm));
    strategy.teardown();
  }
  return out;
}

// A pipeline: rank (dp 0, stage s, tp 0) of every stage, each on its own thread with its own
// strategy (made from `config`), meta allocator, timeline and trace, meeting in one exchange
// (sim/rank_exchange.h). The job's figures are those of its stages (SimulatedRank::stages).
SimulatedRank simulate_pipeline(const nn::ModelSpec& spec, const TrainOptions& options,
                                const std::string& strategy_name,
                                const strategies::StrategyConfig& config, int world_size,
                                const sim::Cluster& cluster, bool record_trace) {
  const int p = config.pipeline.stages, tp = config.tensor_parallel.size;
  std::vector<int> present;
  for (int s = 0; s < p; ++s) present.push_back(s * tp);  // the mesh is dp x pp x tp
  sim::RankExchange exchange(present);
  std::vector<SimulatedRank> stages(static_cast<size_t>(p));
  std::mutex failed;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int s = 0; s < p; ++s) {
    threads.emplace_back([&, s] {
      const auto i = static_cast<size_t>(s);
      try {
        MetaAllocatorScope memory;  // this stage's memory, apart from the others'
        const std::unique_ptr<strategies::Strategy> strategy =
            strategies::StrategyRegistry::create(strategy_name, config);
        stages[i] = run_rank(spec, options, *strategy, config, present[i], world_size, cluster,
                             record_trace, &exchange);
        stages[i].stage = s;
      } catch (...) {
        {
          std::lock_guard lock(failed);
          if (!first_error) first_error = std::current_exception();
        }
        exchange.abort("stage " + std::to_string(s) + " failed (its error ends the simulation)");
      }
    });
  }
  for (std::thread& t : threads)
    t.join();
  if (first_error) std::rethrow_exception(first_error);
  // The job: the slowest stage's time and traffic, each kind's largest peak, and MFU over
  // every stage's model FLOPs.
  const auto slowest = std::max_element(stages.begin(), stages.end(),
                                        [](const SimulatedRank& a, const SimulatedRank& b) {
                                          return a.step_s < b.step_s;
                                        });
  SimulatedRank job = *slowest;
  double flops = 0;
  job.traces.clear();
  for (const SimulatedRank& stage : stages) {
    job.traces.insert(job.traces.end(), stage.traces.begin(), stage.traces.end());
    for (size_t k = 0; k < kMemoryKindCount; ++k)
      job.peak_bytes_by_kind[k] = std::max(job.peak_bytes_by_kind[k], stage.peak_bytes_by_kind[k]);
    job.peak_bytes = std::max(job.peak_bytes, stage.peak_bytes);
    flops += stage.model_flops;
  }
  job.model_flops = flops / p;
  const DType dtype = sim::compute_dtype(config.precision);
  const double peak = sim::DeviceModel(cluster, 1, dtype).peak_flops(dtype);
  job.mfu = job.step_s > 0 ? job.model_flops / job.step_s / peak : 0;
  job.stages = std::move(stages);
  return job;
}

}  // namespace

SimulatedRank simulate_rank(const nn::ModelSpec& spec, const TrainOptions& options,
                            strategies::Strategy& strategy, const std::string& strategy_name,
                            const strategies::StrategyConfig& config, int world_size,
                            const sim::Cluster& cluster, bool record_trace) {
  if (world_size < 1) tag::kLoomSim.fail("--world-size must be at least 1, got ", world_size);
  check_simulated(strategy_name, config, world_size);
  if (strategies::StrategyRegistry::entry(strategy_name).kind == StrategyKind::Pipeline)
    return simulate_pipeline(spec, options, strategy_name, config, world_size, cluster,
                             record_trace);
  return run_rank(spec, options, strategy, config, /*rank=*/0, world_size, cluster, record_trace,
                  /*exchange=*/nullptr);
}

std::map<std::string, int64_t> SimulatedRank::comm_bytes() const {
  std::map<std::string, int64_t> bytes;
  for (const comm::CommCost& c : comm)
    bytes[c.op] += c.bytes;
  return bytes;
}

namespace {

nlohmann::json json_of(const SimulatedRank& rank) {
  nlohmann::json kinds = nlohmann::json::object();
  for (size_t k = 0; k < kMemoryKindCount; ++k)
    kinds[memory_kind_name(static_cast<MemoryKind>(k))] = rank.peak_bytes_by_kind[k];
  nlohmann::json out = {
      {"world_size", rank.world_size},
      {"cluster", rank.cluster},
      {"parameters", rank.parameters},
      {"peak_bytes", rank.peak_bytes},
      {"peak_bytes_by_kind", kinds},
      {"flops_per_step", rank.compute.flops},
      {"bytes_per_step", rank.compute.bytes_read + rank.compute.bytes_written},
      {"comm_bytes_per_step", rank.comm_bytes()},
      {"ms_per_step", rank.step_s * 1e3},
      {"compute_ms", rank.compute_s * 1e3},
      {"exposed_comm_ms", rank.exposed_comm_s * 1e3},
      {"bubble_ms", rank.bubble_s * 1e3},
      {"comm_busy_ms", rank.comm_busy_s * 1e3},
      {"tflops_per_rank", rank.step_s > 0 ? rank.model_flops / rank.step_s / 1e12 : 0},
      {"mfu", rank.mfu},
      {"device_memory_bytes", rank.device_memory_bytes},
      {"fits_device_memory", rank.fits_device_memory()}};
  if (!rank.stages.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    for (const SimulatedRank& stage : rank.stages) {
      nlohmann::json one = json_of(stage);
      one["stage"] = stage.stage;
      one["rank"] = stage.rank;
      stages.push_back(std::move(one));
    }
    out["stages"] = std::move(stages);
  }
  return out;
}

}  // namespace

std::string simulated_rank_json(const SimulatedRank& rank) { return json_of(rank).dump(); }

}  // namespace loom::train_gpt
