// loomrun: starts the local ranks of a job the way torchrun does (same flags and
// environment), serves the job's TCP store on node 0, relays the ranks' output with a
// "[rank] " prefix, and stops or restarts the whole group when one rank fails.
// See launcher.h for the life cycle and the exit codes; usage errors exit 2.

#include <cstdlib>
#include <memory>

#include "comm/store/tcp_store.h"
#include "core/error.h"
#include "core/tunables.h"
#include "tools/loomrun/binding.h"
#include "tools/loomrun/launcher.h"
#include "tools/loomrun/log.h"
#include "tools/loomrun/options.h"
#include "tools/loomrun/signal_pipe.h"

namespace {

using namespace loom::loomrun;

constexpr int kUsageExitCode = 2;

int run(int argc, char** argv) {
  const char* env_secret = loom::tunable_value(loom::tunables::kStoreSecret);
  bool secret_in_env = env_secret != nullptr && *env_secret != '\0';
  LaunchOptions options;
  try {
    ParseResult parsed = parse_options(argc, argv, secret_in_env);
    if (!parsed.options) return parsed.exit_code;
    options = std::move(*parsed.options);
  } catch (const UsageError& e) {
    say("error: ", e.message);
    say("run 'loomrun --help' for usage");
    return kUsageExitCode;
  }

  // Before any thread exists (the store server starts one), so every thread inherits it.
  SignalPipe signals;

  std::unique_ptr<BindingPlan> binding;
  if (options.bind != BindMode::None) {
    binding = std::make_unique<BindingPlan>(options.bind, options.nproc_per_node);
    for (int local = 0; local < options.nproc_per_node; ++local) {
      say("rank ", options.node_rank * options.nproc_per_node + local, " -> ",
          binding->describe(local));
    }
  }

  std::string secret = secret_in_env ? env_secret : loom::comm::generate_store_secret();
  std::unique_ptr<loom::comm::TCPStoreServer> store;
  int master_port = options.master_port;
  if (options.node_rank == 0) {
    try {
      store = std::make_unique<loom::comm::TCPStoreServer>(
          options.master_addr, static_cast<uint16_t>(options.master_port), secret);
    } catch (const loom::CommError& e) {
      say("cannot serve the store on ", options.master_addr, ":", options.master_port, ": ",
          e.what());
      return 1;
    }
    master_port = store->port();
  }
  say("starting ", options.nproc_per_node, " rank(s) of ", options.world_size(), " on node ",
      options.node_rank, " of ", options.nnodes, "; store ",
      (options.node_rank == 0 ? "served on " : "on node 0 at "), options.master_addr, ":",
      master_port);

  return Launcher(options, master_port, std::move(secret), binding.get(), signals).run();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    say("error: ", e.what());
    return 1;
  }
}
