#pragma once
// Backends by name. Built-in: "shm" (processes on one host), "tcp", "hierarchical" (shm within
// hosts, tcp or ucx between them), and by build "ucx" (LOOM_WITH_UCX) and "nccl"
// (LOOM_WITH_NCCL, one GPU per rank). "auto" picks by device and host layout
// (resolve_auto_backend). Users register their own backend the way the built-ins are:
//   loom::comm::BackendRegistry::add("mine", {.factory = [](const BackendContext& c) {
//       return std::make_unique<MyBackend>(c); }, .description = "my transport"});
// The verbs are every Loom registry's (core/registry.h): add, remove, contains, create, list.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"
#include "comm/environment.h"

namespace loom::comm {

using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendContext&)>;

struct BackendEntry {
  BackendFactory factory;
  std::string description;
};

class BackendRegistry {
 public:
  // Throws loom::Error when `name` is taken, empty or "auto", or the factory empty.
  static void add(const std::string& name, BackendEntry entry);
  static bool remove(const std::string& name);
  // Whether `name` is registered (ucx exists only in builds with UCX, nccl in builds with
  // NCCL; hierarchical uses tcp between hosts, ucx where an RDMA device is: docs/multihost.md).
  static bool contains(const std::string& name);
  // Creates the backend `name`; an unknown name is require()'s error.
  static std::unique_ptr<Backend> create(const std::string& name, const BackendContext& context);
  // (name, description) of every registered backend, sorted by name.
  static std::vector<std::pair<std::string, std::string>> list();
  // Throws loom::Error unless `name` is registered: naming the build option for a backend
  // Loom has but this build lacks, else listing the available names and the closest match.
  static void require(const std::string& name);
};

// The names before 2026-12-03, kept for existing programs.
[[deprecated("use BackendRegistry::add")]] void register_backend(const std::string& name,
                                                                 BackendFactory factory,
                                                                 std::string description);
[[deprecated("use BackendRegistry::remove")]] bool remove_backend(const std::string& name);
[[deprecated("use BackendRegistry::list")]] std::vector<std::pair<std::string, std::string>>
available_backends();
[[deprecated("use BackendRegistry::contains")]] bool backend_available(const std::string& name);
[[deprecated("use BackendRegistry::require")]] void require_backend(const std::string& name);
[[deprecated("use BackendRegistry::create")]] std::unique_ptr<Backend> create_backend(
    const std::string& name, const BackendContext& context);

// What a group needs of its backend: the facts "auto" is decided by.
struct BackendNeeds {
  Device device = Device::cpu();  // where the group's tensors live
  bool multi_host = false;        // the group's ranks span hosts
  int local_ranks = 1;            // the group's ranks on this host
  int gpus = -1;                  // GPUs selected on this host (-1: one per local rank)
};

// What a group of the job `env` describes needs, for tensors on `device` with `gpus` GPUs
// selected on this host (-1: one per local rank). The one way BackendNeeds is made: comm::init,
// ProcessGroup, ParallelStrategy and the local launcher all ask through it, so that every
// rank of a job reaches the same "auto".
BackendNeeds backend_needs(const ClusterEnv& env, Device device, int gpus = -1);

// What "auto" means, decided here only (docs/multihost.md has the table): "nccl" for CUDA
// tensors when every local rank has a GPU of its own (NCCL refuses two ranks on one GPU) and
// the build has NCCL; else "hierarchical" for a multi-host group (in every build: tcp between
// hosts where UCX is missing); else "shm", which stages CUDA tensors through pinned host memory.
std::string resolve_auto_backend(const BackendNeeds& needs);

}  // namespace loom::comm
