#include "tools/train_gpt/simulation.h"

#include <nlohmann/json.hpp>

#include "comm/store/in_process_store.h"
#include "core/tags.h"
#include "sim/timeline.h"
#include "strategies/devices.h"
#include "strategies/plugins.h"
#include "strategies/registry.h"

namespace loom::train_gpt {

namespace {

void check_symmetric(const std::string& name, int world_size) {
  using strategies::StrategyKind;
  const StrategyKind kind = strategies::StrategyRegistry::entry(name).kind;
  if (kind == StrategyKind::Pipeline) {
    tag::kLoomSim.fail("--strategy ", name,
                       " is not simulated yet: a pipeline's stages do different work, and the "
                       "simulator runs one rank (docs/simulation.md); simulate single_device, "
                       "the ddp and sharded names (hybrid sharding included) or model_parallel");
  }
  if (kind == StrategyKind::SingleDevice && world_size != 1) {
    tag::kLoomSim.fail("--strategy ", name, " runs on 1 rank, not --world-size ", world_size);
  }
}

}  // namespace

SimulatedRank simulate_rank(const nn::ModelSpec& spec, const TrainOptions& options,
                            strategies::Strategy& strategy, const std::string& strategy_name,
                            const strategies::StrategyConfig& config, int world_size,
                            const sim::Cluster& cluster, strategies::Trace* trace) {
  if (world_size < 1) tag::kLoomSim.fail("--world-size must be at least 1, got ", world_size);
  check_symmetric(strategy_name, world_size);
  const Device meta = Device::meta();
  const DType compute_dtype = sim::compute_dtype(config.precision);
  sim::Timeline timeline(cluster, /*rank=*/0, world_size, compute_dtype, trace);
  SimulatedRank out;
  out.world_size = world_size;
  out.cluster = cluster.name;
  {
    sim::TimelineScope scope(timeline);
    // The rank's host work (the offloaded optimizer, on real host tensors) takes simulated time
    // too, at the cluster's host rates.
    CpuOpReports host_ops;
    strategy.set_accelerator(std::make_shared<strategies::MetaAccelerator>());
    if (auto* parallel = dynamic_cast<strategies::ParallelStrategy*>(&strategy)) {
      parallel->set_process_group(std::make_shared<comm::ProcessGroup>(
          0, world_size, std::make_shared<comm::InProcessStore>(),
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
      job.world_size = world_size;
      job.local_world_size = per_node;
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
    // Values do not matter on meta: zeros, enough for every rank's blocks of both steps.
    const int64_t time = o.model.context;
    const int64_t blocks = 2 * std::max<int64_t>(o.grad_accum, 1) * world_size * o.batch + 1;
    data::TokenBlocks data(std::vector<int32_t>(static_cast<size_t>(blocks * (time + 1)), 0),
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
          const auto offloaded = static_cast<size_t>(MemoryKind::Offloaded);
          out.peak_bytes_by_kind[offloaded] =
              static_cast<int64_t>(allocator_for(Device::cpu()).stats().peak_by_kind[offloaded]);
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

std::map<std::string, int64_t> SimulatedRank::comm_bytes() const {
  std::map<std::string, int64_t> bytes;
  for (const comm::CommCost& c : comm)
    bytes[c.op] += c.bytes;
  return bytes;
}

std::string simulated_rank_json(const SimulatedRank& rank) {
  nlohmann::json kinds = nlohmann::json::object();
  for (size_t k = 0; k < kMemoryKindCount; ++k)
    kinds[memory_kind_name(static_cast<MemoryKind>(k))] = rank.peak_bytes_by_kind[k];
  return nlohmann::json{{"world_size", rank.world_size},
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
                        {"comm_busy_ms", rank.comm_busy_s * 1e3},
                        {"tflops_per_rank", rank.step_s > 0 ? rank.model_flops / rank.step_s / 1e12 : 0},
                        {"mfu", rank.mfu}}
      .dump();
}

}  // namespace loom::train_gpt
