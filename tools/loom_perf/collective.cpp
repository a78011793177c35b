#include "tools/loom_perf/collective.h"

#include <array>

namespace loom::perf {

namespace {

using C = Collective;

// Loom's broadcast and reduce work in place only, and a ring of send/recv needs separate
// send and receive buffers, so those have one placement.
constexpr std::array<CollectiveInfo, 8> kCollectives{{
    {C::AllReduce, "allreduce", true, false, false, true, true},
    {C::Broadcast, "broadcast", false, true, false, false, true},
    {C::Reduce, "reduce", true, true, false, false, true},
    {C::AllGather, "all_gather", false, false, true, true, true},
    {C::ReduceScatter, "reduce_scatter", true, false, true, true, true},
    {C::AllToAll, "all_to_all", false, false, true, true, true},
    {C::SendRecv, "sendrecv", false, false, false, true, false},
    {C::Barrier, "barrier", false, false, false, false, true},
}};

}  // namespace

const CollectiveInfo& collective_info(Collective collective) {
  return kCollectives[static_cast<size_t>(collective)];
}

std::optional<Collective> parse_collective(std::string_view name) {
  for (const CollectiveInfo& info : kCollectives) {
    if (info.name == name) return info.kind;
  }
  // nccl-tests' binary names without "_perf", for muscle memory.
  if (name == "all_reduce") return C::AllReduce;
  if (name == "allgather") return C::AllGather;
  if (name == "reducescatter") return C::ReduceScatter;
  if (name == "alltoall") return C::AllToAll;
  return std::nullopt;
}

std::vector<std::string> collective_names() {
  std::vector<std::string> names;
  for (const CollectiveInfo& info : kCollectives)
    names.emplace_back(info.name);
  return names;
}

double bus_factor(Collective collective, int nranks) {
  const double n = nranks;
  switch (collective) {
    case C::AllReduce: return 2.0 * (n - 1) / n;
    case C::AllGather:
    case C::ReduceScatter:
    case C::AllToAll: return (n - 1) / n;
    case C::Broadcast:
    case C::Reduce:
    case C::SendRecv: return 1.0;
    case C::Barrier: return 0.0;
  }
  return 1.0;
}

}  // namespace loom::perf
