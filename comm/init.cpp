// loom::comm::init(): the default process group from the cluster environment.

#include <cstdlib>
#include <mutex>

#include "comm/backend_registry.h"
#include "comm/environment.h"
#include "comm/process_group.h"
#include "comm/store/in_process_store.h"
#include "comm/store/tcp_store.h"

namespace loom::comm {

namespace {

// Keeps the TCP store server alive for the life of the process when rank 0 serves it.
std::unique_ptr<TCPStoreServer>& own_server() {
  static std::unique_ptr<TCPStoreServer> server;
  return server;
}

uint16_t store_port(const ClusterEnv& env) {
  // LOOM_STORE_PORT lets the Loom store live beside another launcher's store (torchrun keeps
  // MASTER_PORT for its own).
  if (const char* port = std::getenv("LOOM_STORE_PORT"); port != nullptr && *port != '\0') {
    return static_cast<uint16_t>(std::stoi(port));
  }
  return static_cast<uint16_t>(env.master_port);
}

std::shared_ptr<Store> rendezvous_store(const ClusterEnv& env, int rank, int size,
                                        Duration timeout) {
  if (size == 1) return std::make_shared<InProcessStore>();
  std::string secret = env.store_secret;
  if (secret.empty()) {
    fail("[comm] init: ", size,
         " ranks need a shared store secret: run under loomrun, or "
         "export the same LOOM_STORE_SECRET (e.g. from `openssl rand -hex 32`) to every rank");
  }
  const char* served = std::getenv("LOOM_STORE_SERVED_BY_LAUNCHER");
  bool launcher_serves = served != nullptr && std::string(served) == "1";
  if (rank == 0 && !launcher_serves) {
    own_server() = std::make_unique<TCPStoreServer>(env.master_addr, store_port(env), secret);
  }
  return std::make_shared<TCPStore>(env.master_addr, store_port(env), secret, timeout);
}

}  // namespace

std::string default_group_name(int restart_count) {
  return "default.attempt" + std::to_string(restart_count);
}

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  ClusterEnv env = options.environment ? *options.environment : detect_cluster_env();
  int rank = options.rank.value_or(env.rank);
  int size = options.size.value_or(env.world_size);
  if (rank < 0 || rank >= size) {
    fail("[comm] init: rank ", rank, " is not below the world size ", size);
  }
  std::shared_ptr<Store> store =
      options.store ? options.store : rendezvous_store(env, rank, size, options.timeout);
  std::string backend = options.backend;
  if (backend == "auto") {
    backend = resolve_auto_backend(env.multi_host(), options.device.value_or(Device::cpu()));
  }
  std::string name = default_group_name(env.restart_count);
  return std::make_shared<ProcessGroup>(
      rank, size, std::move(store),
      GroupOptions{.backend = backend, .timeout = options.timeout, .device = options.device}, name);
}

}  // namespace loom::comm
