// loom::comm::init(): the default process group from the cluster environment.

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "comm/backend_registry.h"
#include "comm/environment.h"
#include "comm/process_group.h"
#include "comm/store/in_process_store.h"
#include "comm/store/tcp_store.h"
#include "core/tags.h"
#include "core/tunables.h"

namespace loom::comm {

namespace {

// Keeps the TCP store server alive for the life of the process when rank 0 serves it.
std::unique_ptr<TCPStoreServer>& own_server() {
  static std::unique_ptr<TCPStoreServer> server;
  return server;
}

// The port of Loom's store: LOOM_STORE_PORT when set (and not empty), else MASTER_PORT.
// LOOM_STORE_PORT lets the Loom store live beside another launcher's store (torchrun keeps
// MASTER_PORT for its own). Only 1..65535 is a port here: every rank must know it in advance,
// so 0 ("any free port") cannot work, and a value cast to 16 bits would point the ranks at
// some other port, where they would wait for a store until the timeout.
// Under torchrun (TORCHELASTIC_RUN_ID is set), whose own store holds MASTER_PORT, the default
// is MASTER_PORT + 1 instead: every rank computes the same port, and torchrun users need no
// Loom-specific setting beyond the store secret.
uint16_t store_port(const ClusterEnv& env) {
  const char* text = tunable_value(tunables::kStorePort);
  if (text == nullptr || *text == '\0') {
    const char* torchrun = std::getenv("TORCHELASTIC_RUN_ID");
    if (torchrun == nullptr || *torchrun == '\0') return static_cast<uint16_t>(env.master_port);
    if (env.master_port >= 65535) {
      tag::kComm.fail(
          "init: under torchrun Loom's store takes MASTER_PORT + 1, but MASTER_PORT is ",
          env.master_port, "; set ", tunables::kStorePort.name,
          " to a free port (the same on every rank)");
    }
    return static_cast<uint16_t>(env.master_port + 1);
  }
  const char* end = text + std::strlen(text);
  int port = 0;
  const auto [stop, ec] = std::from_chars(text, end, port);
  if (ec != std::errc() || stop != end || port < 1 || port > 65535) {
    tag::kComm.fail("init: ", tunables::kStorePort.name, "='", text,
                    "' is not a TCP port: expected a number from 1 to 65535 (or unset it to use "
                    "MASTER_PORT)");
  }
  return static_cast<uint16_t>(port);
}

std::shared_ptr<Store> rendezvous_store(const ClusterEnv& env, int rank, int size,
                                        Duration timeout) {
  if (size == 1) return std::make_shared<InProcessStore>();
  std::string secret = env.store_secret;
  if (secret.empty()) {
    tag::kComm.fail(
        "init: ", size, " ranks need a shared store secret: run under loomrun, or export the same ",
        tunables::kStoreSecret.name,
        " (e.g. from `openssl rand -hex 32`) to every rank (under torchrun, mpirun or srun: "
        "export it before starting them)");
  }
  const char* served = tunable_value(tunables::kStoreServedByLauncher);
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
    tag::kComm.fail("init: rank ", rank, " is not below the world size ", size);
  }
  std::shared_ptr<Store> store =
      options.store ? options.store : rendezvous_store(env, rank, size, options.timeout);
  std::string backend = options.backend;
  if (backend == "auto") {
    backend = resolve_auto_backend(backend_needs(env, options.device.value_or(Device::cpu())));
  }
  std::string name = default_group_name(env.restart_count);
  return std::make_shared<ProcessGroup>(
      rank, size, std::move(store),
      GroupOptions{.backend = backend, .timeout = options.timeout, .device = options.device}, name);
}

}  // namespace loom::comm
