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
// Whether `name` is registered (ucx and hierarchical exist only in builds with UCX).
bool backend_available(const std::string& name);
// Throws loom::Error unless `name` is registered: naming the build option for a backend Loom
// has but this build lacks, else listing the available names and the closest match.
void require_backend(const std::string& name);
// Creates the backend `name`; an unknown name is require_backend's error.
std::unique_ptr<Backend> create_backend(const std::string& name, const BackendContext& context);

// What "auto" means for this job: "nccl" for CUDA tensors (loom::Error in a build without
// NCCL), else "shm" when every rank is on this host, "hierarchical" for a multi-host job
// (loom::Error in a build without UCX).
std::string resolve_auto_backend(bool multi_host, Device device);

}  // namespace loom::comm
