#include "comm/sim/sim_backend.h"

#include <string_view>
#include <utility>

#include "core/tags.h"

namespace loom::comm {

namespace {
thread_local CommCostSink* installed_sink = nullptr;
}  // namespace

CommCostSink* set_comm_cost_sink(CommCostSink* sink) {
  return std::exchange(installed_sink, sink);
}

SimInterval CommCostLog::record(const CommCost& cost) {
  std::lock_guard lock(mutex_);
  costs_.push_back(cost);
  return {};
}

std::vector<CommCost> CommCostLog::costs() const {
  std::lock_guard lock(mutex_);
  return costs_;
}

SimBackend::SimBackend(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      group_(context.group_name),
      world_ranks_(context.world_ranks) {
  if (context.device && !context.device->is_meta()) {
    tag::kComm.fail("sim backend: its tensors are on the meta device, not ", *context.device,
                    "; simulate with a meta model (tensor/meta.h)");
  }
}

void SimBackend::report(const char* op, const Tensor& tensor, int peer) {
  CommCostSink* sink = installed_sink;
  const bool p2p = std::string_view(op) == "send" || std::string_view(op) == "recv";
  const Tensor host_tensor = p2p && tensor.device().is_cpu() ? tensor : Tensor();
  const SimInterval when = sink == nullptr ? SimInterval{}
                                           : sink->record({.op = op,
                                                           .group = group_,
                                                           .group_size = size_,
                                                           .bytes = static_cast<int64_t>(tensor.nbytes()),
                                                           .peer = peer,
                                                           .world_ranks = world_ranks_,
                                                           .host_tensor = host_tensor});
  const auto at = [](double seconds) {
    return Clock::time_point(
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds)));
  };
  last_times_ = {.started = at(when.start), .completed = at(when.end)};
}

void SimBackend::allreduce(const Tensor& input, Tensor&, ReduceOp, Deadline) {
  report("allreduce", input);
}

void SimBackend::broadcast(Tensor& tensor, int root, Deadline) {
  report("broadcast", tensor, root);
}

void SimBackend::reduce(Tensor& tensor, int root, ReduceOp, Deadline) {
  report("reduce", tensor, root);
}

void SimBackend::all_gather(Tensor& output, const Tensor&, Deadline) {
  report("all_gather", output);
}

void SimBackend::reduce_scatter(Tensor&, const Tensor& input, ReduceOp, Deadline) {
  report("reduce_scatter", input);
}

void SimBackend::all_to_all(Tensor& output, const Tensor&, Deadline) {
  report("all_to_all", output);
}

void SimBackend::send(const Tensor& tensor, int dst, int, Deadline) {
  report("send", tensor, dst);
}

void SimBackend::recv(Tensor& tensor, int src, int, Deadline) {
  report("recv", tensor, src);
}

void SimBackend::barrier(Deadline) {
  report("barrier", Tensor::empty({0}, DType::U8, Device::meta()));
}

void SimBackend::check_can_split() const {
  tag::kComm.fail("sim backend: group '", group_,
                  "' cannot be split by color: a simulated rank does not know the other ranks' "
                  "colors; split with ProcessGroup::split_by, which is given them "
                  "(docs/simulation.md)");
}

}  // namespace loom::comm
