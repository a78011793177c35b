#include "tools/loomrun/binding.h"

#include <hwloc.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/tags.h"

namespace loom::loomrun {

std::optional<BindMode> parse_bind_mode(std::string_view name) {
  if (name == "none") return BindMode::None;
  if (name == "core") return BindMode::Core;
  if (name == "numa") return BindMode::Numa;
  return std::nullopt;
}

namespace {

std::string cpu_list(hwloc_const_bitmap_t set) {
  char* text = nullptr;
  if (hwloc_bitmap_list_asprintf(&text, set) < 0 || text == nullptr) return "?";
  std::string result(text);
  free(text);
  return result;
}

}  // namespace

struct BindingPlan::Impl {
  hwloc_topology_t topology = nullptr;
  BindMode mode = BindMode::None;
  struct Share {
    int first = 0;  // logical index range of the cores / NUMA nodes
    int last = 0;
    hwloc_bitmap_t cpuset = nullptr;
  };
  std::vector<Share> shares;

  ~Impl() {
    for (Share& share : shares)
      hwloc_bitmap_free(share.cpuset);
    if (topology != nullptr) hwloc_topology_destroy(topology);
  }
};

BindingPlan::BindingPlan(BindMode mode, int local_world_size) : impl_(std::make_unique<Impl>()) {
  impl_->mode = mode;
  if (mode == BindMode::None) return;
  if (hwloc_topology_init(&impl_->topology) != 0) {
    impl_->topology = nullptr;
    tag::kLoomrun.fail("hwloc_topology_init failed");
  }
  if (hwloc_topology_load(impl_->topology) != 0) tag::kLoomrun.fail("hwloc_topology_load failed");

  hwloc_obj_type_t type = mode == BindMode::Core ? HWLOC_OBJ_CORE : HWLOC_OBJ_NUMANODE;
  int count = hwloc_get_nbobjs_by_type(impl_->topology, type);
  if (count <= 0 && mode == BindMode::Core) {
    // Some virtual machines report PUs only; treat each PU as a core.
    type = HWLOC_OBJ_PU;
    count = hwloc_get_nbobjs_by_type(impl_->topology, type);
  }
  if (count <= 0) {
    tag::kLoomrun.fail("--bind ", mode == BindMode::Core ? "core" : "numa", ": hwloc found no ",
                       mode == BindMode::Core ? "cores" : "NUMA nodes", " on this machine");
  }

  for (int rank = 0; rank < local_world_size; ++rank) {
    Impl::Share share;
    if (local_world_size <= count) {
      share.first = static_cast<int>(int64_t{rank} * count / local_world_size);
      share.last = static_cast<int>(int64_t{rank + 1} * count / local_world_size) - 1;
    } else {
      share.first = share.last = rank % count;
    }
    share.cpuset = hwloc_bitmap_alloc();
    for (int i = share.first; i <= share.last; ++i) {
      hwloc_obj_t obj = hwloc_get_obj_by_type(impl_->topology, type, static_cast<unsigned>(i));
      if (obj != nullptr && obj->cpuset != nullptr)
        hwloc_bitmap_or(share.cpuset, share.cpuset, obj->cpuset);
    }
    impl_->shares.push_back(share);
  }
}

BindingPlan::~BindingPlan() = default;

std::string BindingPlan::describe(int local_rank) const {
  if (impl_->mode == BindMode::None) return "unbound";
  const Impl::Share& share = impl_->shares.at(static_cast<size_t>(local_rank));
  std::string kind = impl_->mode == BindMode::Core ? "cores " : "numa ";
  return kind + std::to_string(share.first) + "-" + std::to_string(share.last) + " (cpus " +
         cpu_list(share.cpuset) + ")";
}

int BindingPlan::apply(int local_rank) const noexcept {
  if (impl_->mode == BindMode::None) return 0;
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= impl_->shares.size()) return EINVAL;
  if (hwloc_set_cpubind(impl_->topology, impl_->shares[static_cast<size_t>(local_rank)].cpuset,
                        HWLOC_CPUBIND_PROCESS) != 0) {
    return errno != 0 ? errno : EINVAL;
  }
  return 0;
}

}  // namespace loom::loomrun
