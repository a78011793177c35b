// detect_cluster_env: reads one launcher's or scheduler's variables into a ClusterEnv and
// checks them for consistency. Every source fills the same raw fields (naming the variables
// they came from, for messages); finish() validates them and resolves the master.

#include "comm/environment.h"

#include <charconv>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "core/tags.h"
#include "core/tunables.h"

namespace loom::comm {

namespace {

constexpr const char* kSourceNames = "torchrun, slurm, openmpi, pmi, single (or auto)";
constexpr const char* kDefaultMaster = "127.0.0.1";
constexpr int kDefaultPort = 29500;

// One variable's value with the name it came from.
struct Var {
  std::string name;
  int value = 0;
};

// The variables of one source, before validation. Absent optionals take defaults in finish().
struct RawEnv {
  Var rank;
  Var world_size;
  std::optional<Var> local_rank;
  std::optional<Var> local_world_size;
  std::optional<Var> node_rank;
  std::optional<std::string> derived_master;  // a scheduler's first host
  std::string master_hint;                    // what else could name the master, for messages
};

class EnvReader {
 public:
  EnvReader(const GetEnv& getenv, std::string source, std::string selected_by)
      : getenv_(getenv), source_(std::move(source)), selected_by_(std::move(selected_by)) {}

  const std::string& source() const { return source_; }

  std::optional<std::string> raw(const std::string& name) const { return getenv_(name); }
  bool has(const std::string& name) const { return getenv_(name).has_value(); }

  template <typename... Parts>
  [[noreturn]] void error(const Parts&... parts) const {
    tag::kCommEnv.fail(source_, ": ", parts...);
  }

  // A non-negative integer variable, if set.
  std::optional<Var> integer(const std::string& name) const {
    const auto text = getenv_(name);
    if (!text) return std::nullopt;
    int value = 0;
    const char* begin = text->data();
    const char* end = begin + text->size();
    const auto [ptr, ec] = std::from_chars(begin, end, value);
    if (text->empty() || ec != std::errc() || ptr != end) {
      error(name, "='", *text, "' is not an integer");
    }
    if (value < 0) error(name, "=", value, " is negative; expected a value >= 0");
    return Var{name, value};
  }

  // A non-negative integer variable the source cannot do without.
  Var required(const std::string& name) const {
    auto var = integer(name);
    if (!var) error(name, " is not set", selected_by_);
    return *var;
  }

 private:
  const GetEnv& getenv_;
  std::string source_;
  std::string selected_by_;  // " (selected by LOOM_CLUSTER_ENV=slurm)" or ""
};

// SLURM_TASKS_PER_NODE ("2(x3),1": two tasks on each of three nodes, then one) for node `node`.
int slurm_tasks_on_node(const EnvReader& env, const std::string& name, const std::string& list,
                        int node) {
  auto malformed = [&] {
    env.error(name, "='", list, "' is not a Slurm task count list (expected e.g. '4(x2),3')");
  };
  int first_node = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(pos, comma - pos);
    int tasks = 0;
    int repeat = 1;
    const char* begin = item.data();
    const char* end = begin + item.size();
    auto [ptr, ec] = std::from_chars(begin, end, tasks);
    if (item.empty() || ec != std::errc()) malformed();
    if (ptr != end) {
      if (end - ptr < 4 || ptr[0] != '(' || ptr[1] != 'x' || end[-1] != ')') malformed();
      auto [rptr, rec] = std::from_chars(ptr + 2, end - 1, repeat);
      if (rec != std::errc() || rptr != end - 1 || repeat < 1) malformed();
    }
    if (node < first_node + repeat) return tasks;
    first_node += repeat;
    pos = comma + 1;
  }
  env.error(name, "='", list, "' lists ", first_node, " nodes, but this is node ", node);
}

RawEnv read_torchrun(const EnvReader& env) {
  RawEnv raw;
  raw.rank = env.required("RANK");
  raw.world_size = env.required("WORLD_SIZE");
  raw.local_rank = env.integer("LOCAL_RANK");
  raw.local_world_size = env.integer("LOCAL_WORLD_SIZE");
  raw.node_rank = env.integer("GROUP_RANK");
  return raw;
}

RawEnv read_slurm(const EnvReader& env) {
  RawEnv raw;
  raw.rank = env.required("SLURM_PROCID");
  raw.world_size = env.required("SLURM_NTASKS");
  raw.local_rank = env.integer("SLURM_LOCALID");
  raw.node_rank = env.integer("SLURM_NODEID");
  if (auto list = env.raw("SLURM_TASKS_PER_NODE")) {
    const int node = raw.node_rank ? raw.node_rank->value : 0;
    raw.local_world_size =
        Var{"SLURM_TASKS_PER_NODE", slurm_tasks_on_node(env, "SLURM_TASKS_PER_NODE", *list, node)};
  } else {
    raw.local_world_size = env.integer("SLURM_NTASKS_PER_NODE");
  }
  for (const char* name : {"SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (auto nodes = env.raw(name)) {
      raw.derived_master = first_slurm_host(*nodes);
      break;
    }
  }
  raw.master_hint = ", SLURM_JOB_NODELIST or SLURM_NODELIST";
  return raw;
}

RawEnv read_openmpi(const EnvReader& env) {
  RawEnv raw;
  raw.rank = env.required("OMPI_COMM_WORLD_RANK");
  raw.world_size = env.required("OMPI_COMM_WORLD_SIZE");
  raw.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK");
  raw.local_world_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE");
  return raw;
}

RawEnv read_pmi(const EnvReader& env) {
  RawEnv raw;
  raw.rank = env.required("PMI_RANK");
  raw.world_size = env.required("PMI_SIZE");
  raw.local_rank = env.integer("MPI_LOCALRANKID");
  raw.local_world_size = env.integer("MPI_LOCALNRANKS");
  return raw;
}

ClusterEnv finish(const EnvReader& env, const RawEnv& raw) {
  ClusterEnv out;
  out.source = env.source();
  const Var& rank = raw.rank;
  const Var& world = raw.world_size;
  if (world.value < 1) env.error(world.name, "=", world.value, " is not positive");
  if (rank.value >= world.value) {
    env.error(rank.name, "=", rank.value, " is not below ", world.name, "=", world.value);
  }
  const Var local_world = raw.local_world_size.value_or(Var{world.name, world.value});
  if (local_world.value < 1)
    env.error(local_world.name, "=", local_world.value, " is not positive");
  if (local_world.value > world.value) {
    env.error(local_world.name, "=", local_world.value, " is above ", world.name, "=", world.value);
  }
  const Var local_rank = raw.local_rank.value_or(
      Var{rank.name + " % " + local_world.name, rank.value % local_world.value});
  if (local_rank.value >= local_world.value) {
    env.error(local_rank.name, "=", local_rank.value, " is not below ", local_world.name, "=",
              local_world.value);
  }
  out.rank = rank.value;
  out.world_size = world.value;
  out.local_rank = local_rank.value;
  out.local_world_size = local_world.value;
  out.node_rank = raw.node_rank ? raw.node_rank->value : rank.value / local_world.value;

  if (auto addr = env.raw("MASTER_ADDR")) {
    if (addr->empty()) env.error("MASTER_ADDR is set but empty; expected a host name or address");
    out.master_addr = *addr;
  } else if (raw.derived_master) {
    out.master_addr = *raw.derived_master;
  } else if (out.multi_host()) {
    env.error("MASTER_ADDR", raw.master_hint, " is not set, but the world spans several hosts (",
              world.name, "=", world.value, ", ", local_world.name, "=", local_world.value,
              "); set MASTER_ADDR to the host of rank 0");
  } else {
    out.master_addr = kDefaultMaster;
  }
  out.master_port = kDefaultPort;
  if (auto port = env.integer("MASTER_PORT")) {
    if (port->value < 1 || port->value > 65535) {
      env.error("MASTER_PORT=", port->value, " is not a TCP port (expected 1-65535)");
    }
    out.master_port = port->value;
  }
  out.store_secret = env.raw(tunables::kStoreSecret.name).value_or("");
  auto restarts = env.integer(tunables::kRestartCount.name);
  if (!restarts) restarts = env.integer("TORCHELASTIC_RESTART_COUNT");
  out.restart_count = restarts ? restarts->value : 0;
  return out;
}

// The source auto-detection picks, by the documented precedence.
std::string detect_source(const GetEnv& getenv) {
  auto has = [&](const char* name) { return getenv(name).has_value(); };
  if (has("RANK") && has("WORLD_SIZE")) return "torchrun";
  if (has("SLURM_PROCID") && has("SLURM_NTASKS")) return "slurm";
  if (has("OMPI_COMM_WORLD_RANK")) return "openmpi";
  if (has("PMI_RANK")) return "pmi";
  return "single";
}

}  // namespace

std::optional<std::string> process_env(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

ClusterEnv detect_cluster_env(const GetEnv& getenv, std::optional<std::string> force) {
  std::string source;
  std::string selected_by;
  if (force) {
    source = *force;
    selected_by = " (selected by the caller)";
    if (source.empty() || source == "auto") selected_by.clear();
  } else if (auto named = getenv(tunables::kClusterEnv.name); named && !named->empty()) {
    source = *named;
    selected_by = std::string(" (selected by ") + tunables::kClusterEnv.name + "=" + source + ")";
    if (source == "auto") selected_by.clear();
  }
  if (source.empty() || source == "auto") {
    source = detect_source(getenv);
    // RANK or WORLD_SIZE alone is a launcher set up by half (a script that exports one of
    // them), not a single process: training alone would silently ignore the others.
    const bool rank = getenv("RANK").has_value(), world = getenv("WORLD_SIZE").has_value();
    if (source == "single" && rank != world) {
      const char* set = rank ? "RANK" : "WORLD_SIZE";
      const char* unset = rank ? "WORLD_SIZE" : "RANK";
      tag::kCommEnv.fail(set, "='", getenv(set).value_or(""), "' is set but ", unset,
                         " is not: a launcher (loomrun, torchrun) sets both; set ", unset,
                         " too, or unset ", set, " to run as one process (or set ",
                         tunables::kClusterEnv.name, "=single)");
    }
  }

  EnvReader env(getenv, source, selected_by);
  if (source == "torchrun") return finish(env, read_torchrun(env));
  if (source == "slurm") return finish(env, read_slurm(env));
  if (source == "openmpi") return finish(env, read_openmpi(env));
  if (source == "pmi") return finish(env, read_pmi(env));
  if (source == "single") {
    RawEnv raw;
    raw.rank = Var{"rank", 0};
    raw.world_size = Var{"world size", 1};
    return finish(env, raw);
  }
  const std::string named_by =
      force ? "requested cluster environment " : std::string(tunables::kClusterEnv.name) + "=";
  tag::kCommEnv.fail(named_by, "'", source, "' is not a known source; expected one of ",
                     kSourceNames);
}

std::string first_slurm_host(const std::string& nodelist) {
  auto malformed = [&](const char* why) {
    tag::kCommEnv.fail("Slurm node list '", nodelist, "' is malformed: ", why,
                       " (expected e.g. 'node[03-05,9],gpu1')");
  };
  const size_t begin = nodelist.find_first_not_of(" \t\n");
  if (begin == std::string::npos) malformed("it is empty");
  std::string host;
  size_t i = begin;
  while (i < nodelist.size()) {
    const char c = nodelist[i];
    if (c == ',' || c == ' ' || c == '\t' || c == '\n') break;  // the end of the first host
    if (c == ']') malformed("']' without '['");
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    // A range group: keep its first number as written (zero padding included).
    const size_t close = nodelist.find(']', i);
    if (close == std::string::npos) malformed("'[' without ']'");
    const std::string group = nodelist.substr(i + 1, close - i - 1);
    const std::string first = group.substr(0, group.find_first_of(",-"));
    if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos) {
      malformed("a range must start with a number");
    }
    host += first;
    i = close + 1;
  }
  if (host.empty()) malformed("the first host is empty");
  return host;
}

std::map<std::string, std::string> rank_variables(const RankAssignment& rank) {
  const std::string port = std::to_string(rank.store_port);
  return {
      {"RANK", std::to_string(rank.rank)},
      {"LOCAL_RANK", std::to_string(rank.local_rank)},
      {"WORLD_SIZE", std::to_string(rank.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(rank.local_world_size)},
      {"GROUP_RANK", std::to_string(rank.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(rank.nnodes)},
      {"ROLE_RANK", std::to_string(rank.rank)},
      {"ROLE_WORLD_SIZE", std::to_string(rank.world_size)},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", rank.master_addr},
      {"MASTER_PORT", port},
      {tunables::kStorePort.name, port},
      {tunables::kStoreSecret.name, rank.store_secret},
      {tunables::kRestartCount.name, std::to_string(rank.restart_count)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(rank.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(rank.max_restarts)},
      {tunables::kClusterEnv.name, "torchrun"},
      {tunables::kJobId.name, rank.job_id},
      {tunables::kStoreServedByLauncher.name, "1"},
  };
}

std::vector<std::string> environment_with(const std::map<std::string, std::string>& variables,
                                          char** base) {
  std::vector<std::string> env;
  for (char** entry = base; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    if (variables.count(text.substr(0, text.find('='))) == 0) env.push_back(std::move(text));
  }
  for (const auto& [name, value] : variables)
    env.push_back(name + "=" + value);
  return env;
}

ClusterEnv single_host_job(int ranks) {
  ClusterEnv env;
  env.source = "single";
  env.world_size = ranks;
  env.local_world_size = ranks;
  return env;
}

std::optional<int> launcher_rank(const GetEnv& getenv) {
  const std::optional<std::string> text = getenv("RANK");
  if (!text || text->empty()) return std::nullopt;
  int value = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (error != std::errc() || end != text->data() + text->size()) return std::nullopt;
  return value;
}

}  // namespace loom::comm
