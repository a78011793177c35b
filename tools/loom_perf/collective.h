#pragma once
// The collectives loom-perf measures and nccl-tests' conventions for each: which sizes it
// reports, which bus-bandwidth factor it applies, and which placements Loom's API offers.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::perf {

enum class Collective {
  AllReduce,
  Broadcast,
  Reduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  SendRecv,
  Barrier
};

struct CollectiveInfo {
  Collective kind;
  std::string_view name;  // "allreduce", as on the command line
  bool reduces;           // takes -o (redop column), else "none"
  bool rooted;            // takes -r (root column), else -1
  // The reported size is the total over ranks (nccl-tests: all_gather, reduce_scatter,
  // all_to_all); the per-rank part is size / nranks, so sizes round down to a multiple.
  bool split_across_ranks;
  bool out_of_place;  // Loom's API has an out-of-place form
  bool in_place;      // ... and an in-place form
};

const CollectiveInfo& collective_info(Collective collective);
// nullopt for an unknown name.
std::optional<Collective> parse_collective(std::string_view name);
std::vector<std::string> collective_names();

// nccl-tests' busbw = algbw * factor: allreduce 2(n-1)/n; reduce_scatter, all_gather,
// all_to_all (n-1)/n; broadcast, reduce, sendrecv 1 (barrier 0: it moves no data).
double bus_factor(Collective collective, int nranks);

}  // namespace loom::perf
