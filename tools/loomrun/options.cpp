#include "tools/loomrun/options.h"

#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdlib>
#include <sstream>

#include "core/tunables.h"

namespace loom::loomrun {

namespace {

[[noreturn]] void usage_error(const std::string& message) {
  throw UsageError{message};
}

// torchrun's --nnodes takes "M" or "MIN:MAX"; loomrun is not elastic, so MIN must equal MAX.
int parse_nnodes(const std::string& text) {
  auto to_int = [&](const std::string& part) {
    try {
      size_t used = 0;
      int value = std::stoi(part, &used);
      if (used == part.size()) return value;
    } catch (const std::exception&) {
    }
    usage_error("--nnodes expects a number or MIN:MAX, got '" + text + "'");
  };
  size_t colon = text.find(':');
  if (colon == std::string::npos) return to_int(text);
  int low = to_int(text.substr(0, colon));
  int high = to_int(text.substr(colon + 1));
  if (low != high) {
    usage_error("--nnodes " + text + ": elastic node ranges are not supported; give one number");
  }
  return low;
}

// A TCP port named `what` (a flag, or a variable) in `text`: decimal digits only, from
// `lowest` (0 where "any free port" is meaningful, else 1) to 65535.
int parse_port(const std::string& text, const std::string& what, int lowest) {
  int port = -1;
  const char* begin = text.data();
  const char* end = begin + text.size();
  const auto [stop, ec] = std::from_chars(begin, end, port);
  if (text.empty() || ec != std::errc() || stop != end || port < lowest || port > 65535) {
    usage_error(what + " must be a number from " + std::to_string(lowest) + " to 65535" +
                (lowest == 0 ? " (0: a free port, single node only)" : "") + ", got '" + text +
                "'");
  }
  return port;
}

// LOOM_STORE_PORT, if set, names where the ranks find Loom's store; loomrun serves that store
// itself and gives its ranks its own port in it, so a value that is not a port at all is a
// mistake in the caller's environment, refused rather than silently replaced.
void check_store_port_variable() {
  const char* value = tunable_value(tunables::kStorePort);
  if (value == nullptr || *value == '\0') return;
  parse_port(value,
             std::string(tunables::kStorePort.name) +
                 " (in loomrun's environment; its ranks get loomrun's port)",
             1);
}

bool is_executable_file(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::optional<std::string> find_program(const std::string& program) {
  if (program.empty()) return std::nullopt;
  if (program.find('/') != std::string::npos) {
    if (is_executable_file(program)) return program;
    return std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  std::string path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  std::stringstream dirs(path);
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
  }
  return std::nullopt;
}

ParseResult parse_options(int argc, char** argv, bool secret_in_env) {
  CLI::App app{
      "loomrun: start the local ranks of a Loom (or torchrun-style) job, serve its store on "
      "node 0, relay their output and restart or stop them together.\n"
      "Usage: loomrun [OPTIONS] PROGRAM [ARGS...]"};
  app.prefix_command();  // everything from PROGRAM on belongs to the ranks
  LaunchOptions o;
  std::string nnodes = "1";
  std::string bind = "none";
  std::string rdzv_endpoint, rdzv_backend, rdzv_id;
  bool standalone = false;
  bool no_python = false;
  double timeout = 0;
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node, "local ranks to start")
      ->capture_default_str();
  app.add_option("--nnodes", nnodes, "nodes in the job (M, or M:M as torchrun takes it)")
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", o.node_rank, "this node's rank, 0..nnodes-1")
      ->capture_default_str();
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "address of node 0; node 0 binds its store here (0.0.0.0: all interfaces)")
      ->capture_default_str();
  std::string master_port = std::to_string(o.master_port);
  app.add_option("--master-port,--master_port", master_port,
                 "store port, 0 to 65535; 0 picks a free one (single node only)")
      ->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "restart the whole group this many times after a failure")
      ->capture_default_str();
  app.add_option("--bind", bind, "pin each local rank to its share of cores or NUMA nodes")
      ->check(CLI::IsMember({"none", "core", "numa"}))
      ->capture_default_str();
  app.add_option("--timeout", timeout, "stop the job after this many seconds (exit 124)");
  app.add_option("--grace-period,--grace_period", o.grace_period_s,
                 "seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  app.add_flag("--standalone", standalone, "single node on a free port (as torchrun)");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", rdzv_endpoint,
                 "HOST[:PORT], torchrun's spelling of --master-addr/--master-port");
  app.add_option("--rdzv-backend,--rdzv_backend", rdzv_backend, "accepted for torchrun; ignored");
  app.add_option("--rdzv-id,--rdzv_id", rdzv_id, "accepted for torchrun; ignored");
  app.add_flag("--no-python,--no_python", no_python,
               "accepted for torchrun; loomrun always runs PROGRAM itself");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return {std::nullopt, app.exit(e)};  // --help
    usage_error(e.what());
  }

  std::vector<std::string> command = app.remaining();
  if (!command.empty() && command.front() == "--") command.erase(command.begin());
  if (command.empty()) usage_error("no program given: loomrun [OPTIONS] PROGRAM [ARGS...]");
  if (command.front().size() > 1 && command.front()[0] == '-') {
    usage_error("unknown option '" + command.front() +
                "' (put '--' before a PROGRAM starting "
                "with '-')");
  }
  o.program = command.front();
  o.args.assign(command.begin() + 1, command.end());

  o.nnodes = parse_nnodes(nnodes);
  o.bind = *parse_bind_mode(bind);
  if (app.count("--timeout") > 0) o.timeout_s = timeout;
  bool port_given = app.count("--master-port") > 0;
  bool addr_given = app.count("--master-addr") > 0;
  o.master_port = parse_port(master_port, "--master-port", 0);
  if (!rdzv_endpoint.empty()) {
    size_t colon = rdzv_endpoint.rfind(':');
    std::string host = rdzv_endpoint.substr(0, colon);
    if (!addr_given && !host.empty()) o.master_addr = host;
    if (colon != std::string::npos) {
      const int port = parse_port(rdzv_endpoint.substr(colon + 1),
                                  "the port of --rdzv-endpoint " + rdzv_endpoint, 0);
      if (!port_given) o.master_port = port;
      port_given = true;
    }
  }
  if (standalone) {
    if (o.nnodes != 1) usage_error("--standalone runs a single node; drop --nnodes");
    if (!port_given) o.master_port = 0;
  }

  auto number = [](auto value) { return std::to_string(value); };
  if (o.nproc_per_node < 1) {
    usage_error("--nproc-per-node must be at least 1 (got " + number(o.nproc_per_node) + ")");
  }
  if (o.nnodes < 1) usage_error("--nnodes must be at least 1 (got " + number(o.nnodes) + ")");
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    usage_error("--node-rank " + number(o.node_rank) + " is outside 0.." + number(o.nnodes - 1) +
                " (--nnodes " + number(o.nnodes) + ")");
  }
  if (o.master_port == 0 && o.nnodes > 1) {
    usage_error(
        "--master-port 0 works on a single node only: the other nodes cannot learn the "
        "port node 0 picks; give every node the same --master-port");
  }
  if (o.max_restarts < 0) {
    usage_error("--max-restarts must be >= 0 (got " + number(o.max_restarts) + ")");
  }
  if (o.timeout_s && !(*o.timeout_s > 0)) usage_error("--timeout must be > 0 seconds");
  if (!(o.grace_period_s >= 0)) usage_error("--grace-period must be >= 0 seconds");
  if (o.nnodes > 1 && !secret_in_env) {
    usage_error("--nnodes " + number(o.nnodes) + " needs " + tunables::kStoreSecret.name +
                " in the environment: every node's loomrun must give its ranks the same store "
                "secret. Generate one (e.g. `openssl rand -hex 32`) and run `export " +
                tunables::kStoreSecret.name + "=...` on every node before loomrun");
  }
  check_store_port_variable();
  if (!find_program(o.program)) {
    usage_error("program not found or not executable: '" + o.program + "'" +
                (o.program.find('/') == std::string::npos ? " (searched PATH)" : ""));
  }
  return {std::move(o), 0};
}

}  // namespace loom::loomrun
