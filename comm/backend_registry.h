#pragma once
// Backends by name. Built-in: "shm" (processes on one host) and, in a build with NCCL
// (LOOM_WITH_NCCL), "nccl" (one GPU per rank). "auto" picks by device and host layout.
// Users register their own backend the same way the built-ins are registered:
//   loom::comm::register_backend("mine", [](const BackendContext& c) {
//     return std::make_unique<MyBackend>(c); }, "my transport");

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend.h"

namespace loom::comm {

using BackendFactory = std::function<std::unique_ptr<Backend>(const BackendContext&)>;

// Throws loom::Error when `name` is taken or empty.
void register_backend(const std::string& name, BackendFactory factory, std::string description);
bool remove_backend(const std::string& name);
// (name, description) of every registered backend, sorted by name.
std::vector<std::pair<std::string, std::string>> available_backends();
// Whether `name` is registered (ucx exists only in builds with UCX, nccl in builds with NCCL;
// hierarchical uses tcp between hosts, ucx where an RDMA device is: docs/multihost.md).
bool backend_available(const std::string& name);
// Throws loom::Error unless `name` is registered: naming the build option for a backend Loom
// has but this build lacks, else listing the available names and the closest match.
void require_backend(const std::string& name);
// Creates the backend `name`; an unknown name is require_backend's error.
std::unique_ptr<Backend> create_backend(const std::string& name, const BackendContext& context);

// What a group needs of its backend: the facts "auto" is decided by.
struct BackendNeeds {
  Device device = Device::cpu();  // where the group's tensors live
  bool multi_host = false;        // the group's ranks span hosts
  int local_ranks = 1;            // the group's ranks on this host
  int gpus = -1;                  // GPUs selected on this host (-1: one per local rank)
};

// What "auto" means, decided here only (docs/multihost.md has the table): "nccl" for CUDA
// tensors when every local rank has a GPU of its own (NCCL refuses two ranks on one GPU) and
// the build has NCCL; else "hierarchical" for a multi-host group (in every build: tcp between
// hosts where UCX is missing); else "shm", which stages CUDA tensors through pinned host memory.
std::string resolve_auto_backend(const BackendNeeds& needs);

}  // namespace loom::comm
