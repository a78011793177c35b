#include "comm/backend_registry.h"

#include "comm/hierarchical/hierarchical_backend.h"
#include "comm/shm/shm_backend.h"
#include "comm/sim/sim_backend.h"
#include "comm/tcp/tcp_backend.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/tags.h"

#if LOOM_WITH_NCCL
#include "comm/nccl/nccl_backend.h"
#endif
#if LOOM_WITH_UCX
#include "comm/ucx/ucx_backend.h"
#endif

namespace loom::comm {

namespace {

// The built-in backends, added when the registry is first used. "auto" is resolved before
// the registry is asked (resolve_auto_backend), so it is reserved.
struct Registry : NamedRegistry<BackendEntry> {
  Registry() : NamedRegistry<BackendEntry>(tag::kComm, "backend", {"auto"}) {
    add("shm", {[](const BackendContext& c) { return std::make_unique<shm::ShmBackend>(c); },
                "processes on one host through POSIX shared memory (CPU tensors; CUDA "
                "tensors staged through pinned host memory)"});
    add("sim", {[](const BackendContext& c) { return std::make_unique<SimBackend>(c); },
                "simulated: this process is one rank of a group of any size; meta tensors, "
                "nothing moves, every operation's bytes reported (docs/simulation.md)"});
    add("tcp", {[](const BackendContext& c) { return std::make_unique<tcp::TcpBackend>(c); },
                "Loom's own TCP connections: processes on any hosts, each message received "
                "straight into its buffer (CPU tensors; CUDA tensors staged through pinned host "
                "memory)"});
#if LOOM_WITH_NCCL
    add("nccl", {[](const BackendContext& c) { return std::make_unique<nccl::NcclBackend>(c); },
                 "NVIDIA NCCL: one GPU per rank, within and across hosts (CUDA tensors)"});
#endif
#if LOOM_WITH_UCX
    add("ucx", {[](const BackendContext& c) { return std::make_unique<ucx::UcxBackend>(c); },
                "UCX tagged messages: processes on any hosts, over the transports UCX finds (CPU "
                "tensors; CUDA tensors staged through pinned host memory)"});
#endif
    add("hierarchical",
        {[](const BackendContext& c) {
           return std::make_unique<hierarchical::HierarchicalBackend>(c);
         },
         "shm within each host and tcp (ucx over RDMA) between hosts: allreduce, "
         "reduce-scatter and all-gather in two levels (CPU tensors; CUDA tensors staged)"});
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

// Backends Loom has but a build may lack, and how to get them.
const char* missing_build_hint(const std::string& name) {
  if (name == "nccl") return "configure with -DLOOM_WITH_NCCL=ON with CUDA and NCCL installed";
  if (name == "ucx") return "install UCX (Debian: libucx-dev) and configure again";
  return nullptr;
}

}  // namespace

void BackendRegistry::add(const std::string& name, BackendEntry entry) {
  registry().add(name, std::move(entry));
}

bool BackendRegistry::remove(const std::string& name) {
  return registry().remove(name);
}

bool BackendRegistry::contains(const std::string& name) {
  return registry().contains(name);
}

std::vector<std::pair<std::string, std::string>> BackendRegistry::list() {
  return registry().list();
}

void BackendRegistry::require(const std::string& name) {
  if (registry().contains(name)) return;
  if (const char* hint = missing_build_hint(name)) {
    tag::kComm.fail("backend '", name, "' is not in this build: ", hint);
  }
  registry().at(name);  // the unknown-name error
}

std::unique_ptr<Backend> BackendRegistry::create(const std::string& name,
                                                 const BackendContext& context) {
  require(name);
  return registry().at(name).factory(context);
}

void register_backend(const std::string& name, BackendFactory factory, std::string description) {
  BackendRegistry::add(name, {std::move(factory), std::move(description)});
}

bool remove_backend(const std::string& name) {
  return BackendRegistry::remove(name);
}

std::vector<std::pair<std::string, std::string>> available_backends() {
  return BackendRegistry::list();
}

bool backend_available(const std::string& name) {
  return BackendRegistry::contains(name);
}

void require_backend(const std::string& name) {
  BackendRegistry::require(name);
}

std::unique_ptr<Backend> create_backend(const std::string& name, const BackendContext& context) {
  return BackendRegistry::create(name, context);
}

BackendNeeds backend_needs(const ClusterEnv& env, Device device, int gpus) {
  return {.device = device,
          .multi_host = env.multi_host(),
          .local_ranks = env.local_world_size,
          .gpus = gpus};
}

std::string resolve_auto_backend(const BackendNeeds& needs) {
  const bool own_gpu = needs.gpus < 0 || needs.gpus >= needs.local_ranks;
  if (LOOM_WITH_NCCL && needs.device.is_cuda() && own_gpu) return "nccl";
  if (needs.multi_host) return "hierarchical";
  return "shm";
}

}  // namespace loom::comm
