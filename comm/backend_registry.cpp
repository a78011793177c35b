#include "comm/backend_registry.h"

#include <map>
#include <mutex>

#include "comm/shm/shm_backend.h"
#include "core/error.h"

#if LOOM_WITH_NCCL
#include "comm/nccl/nccl_backend.h"
#endif
#if LOOM_WITH_UCX
#include "comm/hierarchical/hierarchical_backend.h"
#include "comm/ucx/ucx_backend.h"
#endif

namespace loom::comm {

namespace {

struct Entry {
  BackendFactory factory;
  std::string description;
};

struct Registry {
  std::mutex mutex;
  std::map<std::string, Entry> entries;
  Registry() {
    entries["shm"] = {[](const BackendContext& c) { return std::make_unique<shm::ShmBackend>(c); },
                      "processes on one host through POSIX shared memory (CPU tensors; CUDA "
                      "tensors staged through pinned host memory)"};
#if LOOM_WITH_NCCL
    entries["nccl"] = {
        [](const BackendContext& c) { return std::make_unique<nccl::NcclBackend>(c); },
        "NVIDIA NCCL: one GPU per rank, within and across hosts (CUDA tensors)"};
#endif
#if LOOM_WITH_UCX
    entries["ucx"] = {
        [](const BackendContext& c) { return std::make_unique<ucx::UcxBackend>(c); },
        "UCX tagged messages: processes on any hosts, over the transports UCX finds (CPU "
        "tensors; CUDA tensors staged through pinned host memory)"};
    entries["hierarchical"] = {
        [](const BackendContext& c) {
          return std::make_unique<hierarchical::HierarchicalBackend>(c);
        },
        "shm within each host and ucx between hosts: allreduce, reduce-scatter and "
        "all-gather in two levels (CPU tensors; CUDA tensors staged)"};
#endif
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

// Backends Loom has but a build may lack, and how to get them.
const char* missing_build_hint(const std::string& name) {
  if (name == "nccl") return "configure with -DLOOM_WITH_NCCL=ON with CUDA and NCCL installed";
  if (name == "ucx" || name == "hierarchical") {
    return "install UCX (Debian: libucx-dev) and configure again";
  }
  return nullptr;
}

std::string names_of(const std::map<std::string, Entry>& entries) {
  std::string names;
  for (const auto& [name, entry] : entries)
    names += (names.empty() ? "" : ", ") + name;
  return names;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory factory, std::string description) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  if (name.empty() || name == "auto") fail("register_backend: '", name, "' is not a usable name");
  if (r.entries.count(name)) fail("register_backend: a backend named '", name, "' exists already");
  r.entries[name] = {std::move(factory), std::move(description)};
}

bool remove_backend(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.entries.erase(name) > 0;
}

std::vector<std::pair<std::string, std::string>> available_backends() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, entry] : r.entries)
    out.emplace_back(name, entry.description);
  return out;
}

bool backend_available(const std::string& name) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.entries.count(name) > 0;
}

std::unique_ptr<Backend> create_backend(const std::string& name, const BackendContext& context) {
  BackendFactory factory;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.entries.find(name);
    if (it == r.entries.end()) {
      if (const char* hint = missing_build_hint(name)) {
        fail("[comm] backend '", name, "' is not in this build: ", hint, "; available: ",
             names_of(r.entries), ", auto");
      }
      fail("[comm] unknown backend '", name, "'; available: ", names_of(r.entries), ", auto");
    }
    factory = it->second.factory;
  }
  return factory(context);
}

std::string resolve_auto_backend(bool multi_host, Device device) {
  if (device.is_cuda()) {
#if LOOM_WITH_NCCL
    return "nccl";
#else
    fail("[comm] backend 'auto' for ", device,
         ": this build has no NCCL backend (configure with -DLOOM_WITH_NCCL=ON and NCCL "
         "installed); on one host, backend 'shm' moves CUDA tensors through pinned host memory");
#endif
  }
  if (multi_host) {
#if LOOM_WITH_UCX
    return "hierarchical";
#else
    fail("[comm] backend 'auto' for a multi-host job: this build has no inter-host backend (",
         missing_build_hint("ucx"), "); 'shm' connects processes of one host only");
#endif
  }
  return "shm";
}

}  // namespace loom::comm
