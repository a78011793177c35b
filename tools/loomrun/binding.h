#pragma once
// CPU binding of local ranks (--bind core|numa) through hwloc.
// Cores (or NUMA nodes) are split evenly among the local ranks in hwloc's logical order:
// with C cores and N <= C ranks, local rank i gets cores [i*C/N, (i+1)*C/N); with N > C the
// ranks share cores round-robin (rank i gets core i % C). A rank is bound to every PU of
// its objects, so hyperthreads of a core stay together.

#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace loom::loomrun {

enum class BindMode { None, Core, Numa };

std::optional<BindMode> parse_bind_mode(std::string_view name);  // "none", "core", "numa"

// The cpuset of every local rank, computed once in loomrun before any rank starts.
class BindingPlan {
 public:
  // Loads the topology of this machine (restricted to the CPUs this process may use).
  // Throws loom::Error when hwloc fails or finds no objects of the requested kind.
  BindingPlan(BindMode mode, int local_world_size);
  ~BindingPlan();
  BindingPlan(const BindingPlan&) = delete;
  BindingPlan& operator=(const BindingPlan&) = delete;

  // "cores 0-1 (cpus 0-3)" or "numa 0-0 (cpus 0-15)": logical object range, OS cpu list.
  std::string describe(int local_rank) const;

  // Binds the calling process (HWLOC_CPUBIND_PROCESS) to local_rank's cpuset. Meant for the
  // forked child right before exec; it only reads the plan. Returns 0 or an errno value.
  int apply(int local_rank) const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::loomrun
