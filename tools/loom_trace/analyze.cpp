#include "tools/loom_trace/analyze.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/regular_file.h"
#include "core/error.h"
#include "core/tags.h"
#include "core/tunables.h"

namespace loom::trace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// One flight-recorder entry, as analyze needs it (the times are not used).
struct Entry {
  std::string group;
  int group_size = 0;
  uint64_t seq = 0;
  std::string op;
  int64_t bytes = 0;
  std::string dtype;
  int peer = -1;  // point-to-point operations only
  std::string state;
  std::string error;
};

struct Dump {
  fs::path path;
  int rank = 0;
  std::vector<Entry> entries = {};
};

// A JSON value as an error message shows it: its text (cut short) and its type.
std::string shown(const json& value) {
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text + " (" + value.type_name() + ")";
}

// Reads one dump's fields; every error names the file, the entry and the field, what it
// holds and what was expected.
class DumpReader {
 public:
  explicit DumpReader(fs::path path) : path_(std::move(path)) {}

  Dump read(const json& dump) const {
    if (!dump.is_object()) bad("", "the file holds " + shown(dump) + ", not a JSON object");
    Dump out{.path = path_, .rank = static_cast<int>(integer(dump, "rank", "", 0, INT32_MAX))};
    const json& entries = field(dump, "entries", "");
    if (!entries.is_array()) {
      bad("", "'entries' is " + shown(entries) + "; expected a list of entries");
    }
    for (size_t i = 0; i < entries.size(); ++i)
      out.entries.push_back(entry(entries[i], "entry " + std::to_string(i) + ": "));
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    tag::kLoomTrace.fail(path_.string(), ": ", where, what);
  }

  const json& field(const json& object, const char* name, const std::string& where) const {
    auto it = object.find(name);
    if (it == object.end()) bad(where, std::string("no '") + name + "' field");
    return *it;
  }

  int64_t integer(const json& object, const char* name, const std::string& where, int64_t lowest,
                  int64_t highest) const {
    const json& value = field(object, name, where);
    // A non-negative JSON integer is held unsigned (up to 2^64 - 1), a negative one signed.
    const bool in_range = value.is_number_unsigned()
                              ? value.get<uint64_t>() <= static_cast<uint64_t>(highest) &&
                                    static_cast<int64_t>(value.get<uint64_t>()) >= lowest
                              : value.is_number_integer() && value.get<int64_t>() >= lowest &&
                                    value.get<int64_t>() <= highest;
    if (!in_range) {
      bad(where, std::string("'") + name + "' is " + shown(value) + "; expected an integer from " +
                     std::to_string(lowest) + " to " + std::to_string(highest));
    }
    return value.get<int64_t>();
  }

  // Sequence numbers take the whole unsigned range.
  uint64_t sequence(const json& object, const std::string& where) const {
    const json& value = field(object, "seq", where);
    if (!value.is_number_unsigned()) {
      bad(where, "'seq' is " + shown(value) + "; expected an integer from 0 to " +
                     std::to_string(UINT64_MAX));
    }
    return value.get<uint64_t>();
  }

  std::string text(const json& object, const char* name, const std::string& where) const {
    const json& value = field(object, name, where);
    if (!value.is_string()) {
      bad(where, std::string("'") + name + "' is " + shown(value) + "; expected a string");
    }
    return value.get<std::string>();
  }

  Entry entry(const json& e, const std::string& where) const {
    if (!e.is_object()) bad(where, "the entry is " + shown(e) + "; expected an object");
    Entry out;
    out.group = text(e, "group", where);
    out.group_size = static_cast<int>(integer(e, "group_size", where, 1, INT32_MAX));
    const int64_t group_rank = integer(e, "group_rank", where, 0, INT32_MAX);
    if (group_rank >= out.group_size) {
      bad(where, "'group_rank' " + std::to_string(group_rank) + " is not below 'group_size' " +
                     std::to_string(out.group_size));
    }
    out.seq = sequence(e, where);
    out.op = text(e, "op", where);
    out.bytes = integer(e, "bytes", where, 0, INT64_MAX);
    out.dtype = text(e, "dtype", where);
    out.peer = static_cast<int>(integer(e, "peer", where, -1, INT32_MAX));
    out.state = text(e, "state", where);
    out.error = text(e, "error", where);
    return out;
  }

  fs::path path_;
};

Dump read_dump(const fs::path& path) {
  const std::string text = read_regular_file(path, tag::kLoomTrace, "flight-recorder dump (JSON)");
  json dump;
  try {
    dump = json::parse(text);
  } catch (const json::exception& e) {
    tag::kLoomTrace.fail(path.string(), " is not a flight-recorder dump (not JSON): ", e.what());
  }
  return DumpReader(path).read(dump);
}

std::string describe(const Entry& e) {
  std::ostringstream s;
  s << e.op << " " << e.bytes << " B " << e.dtype << " (" << e.state << ")";
  return s.str();
}

std::string signature(const Entry& e) {
  return e.op + " " + std::to_string(e.bytes) + " " + e.dtype;
}

// DIR's dumps by job rank; loom::Error when there is none, or two claim one rank.
std::map<int, Dump> read_dumps(const fs::path& dir) {
  std::error_code ec;
  fs::directory_iterator files(dir, ec);
  if (ec) {
    tag::kLoomTrace.fail("cannot read the dump directory ", dir.string(), ": ", ec.message(),
                         "; run the job with ", tunables::kFlightRecorderDir.name, "=",
                         dir.string(), " (ranks dump on a failure, or on SIGUSR1)");
  }
  std::map<int, Dump> dumps;
  for (const auto& file : files) {
    const std::string name = file.path().filename().string();
    if (!name.starts_with("flight.rank-") || !name.ends_with(".json")) continue;
    Dump dump = read_dump(file.path());
    auto [it, added] = dumps.try_emplace(dump.rank, dump);
    if (!added) {
      const auto& [first, second] = std::minmax(it->second.path, dump.path);
      tag::kLoomTrace.fail("rank ", dump.rank, " has two dumps, ", first.string(), " and ",
                           second.string(), "; keep one dump per rank (of one run) in ",
                           dir.string());
    }
  }
  if (dumps.empty()) {
    tag::kLoomTrace.fail("no flight.rank-R.json in ", dir.string(), "; run the job with ",
                         tunables::kFlightRecorderDir.name, "=", dir.string(),
                         " (ranks dump on a failure, or on SIGUSR1)");
  }
  return dumps;
}

using RankOps = std::map<int, std::map<uint64_t, Entry>>;  // job rank -> seq -> entry

// What each rank did at `seq` (or the last thing it did before), one line per rank.
void list_ranks_at(std::ostringstream& out, const RankOps& ranks, uint64_t seq) {
  for (const auto& [rank, ops] : ranks) {
    out << "    rank " << rank << ": ";
    auto it = ops.find(seq);
    if (it != ops.end()) {
      out << describe(it->second);
      if (!it->second.error.empty()) out << ": " << it->second.error;
    } else {
      auto last = ops.lower_bound(seq);
      out << "never issued it";
      if (last != ops.begin()) {
        --last;
        out << " (its last: seq " << last->first << ", " << describe(last->second) << ")";
      }
    }
    out << "\n";
  }
}

// What is wrong at `seq` in one group: the ranks disagree on the collective, some rank never
// reached it, or it did not complete everywhere; nullptr when nothing (or when it is a
// point-to-point operation, which only two ranks take part in).
const char* problem_at(const RankOps& ranks, uint64_t seq) {
  std::set<std::string> signatures, states;
  bool missing = false;
  for (const auto& [rank, ops] : ranks) {
    auto it = ops.find(seq);
    if (it == ops.end()) {
      missing = true;
      continue;
    }
    if (it->second.peer >= 0) return nullptr;
    signatures.insert(signature(it->second));
    states.insert(it->second.state);
  }
  if (signatures.size() > 1) return "the ranks disagree on the operation";
  if (missing) return "not every rank reached it";
  if (states.size() > 1 || states.count("completed") == 0) {
    return "issued everywhere but not completed everywhere";
  }
  return nullptr;
}

// Writes the first problem of one group (problem_at), from the first sequence number every
// dump still covers; returns false when there is none.
bool report_first_problem(std::ostringstream& out, const RankOps& ranks) {
  uint64_t from = 0, to = 0;
  for (const auto& [rank, ops] : ranks) {
    from = std::max(from, ops.begin()->first);
    to = std::max(to, ops.rbegin()->first);
  }
  for (uint64_t seq = from; seq <= to; ++seq) {
    if (const char* problem = problem_at(ranks, seq)) {
      out << "  seq " << seq << ": " << problem << ":\n";
      list_ranks_at(out, ranks, seq);
      return true;
    }
    if (seq == to) break;  // `to` may be the largest uint64_t
  }
  return false;
}

}  // namespace

Analysis analyze_flight_dumps(const fs::path& dir) {
  const std::map<int, Dump> dumps = read_dumps(dir);
  std::map<std::string, RankOps> groups;
  std::map<std::string, int> group_sizes;
  for (const auto& [rank, dump] : dumps) {
    for (const Entry& e : dump.entries) {
      groups[e.group][rank][e.seq] = e;
      group_sizes[e.group] = e.group_size;
    }
  }
  Analysis result;
  std::ostringstream out;
  out << "flight-recorder dumps of " << dumps.size() << " rank(s) in " << dir.string() << "\n";
  for (const auto& [group, ranks] : groups) {
    out << "group '" << group << "' (" << group_sizes[group] << " ranks; dumps from "
        << ranks.size() << "):\n";
    if (static_cast<int>(ranks.size()) < group_sizes[group])
      out << "  some of its ranks left no dump (they may still be running, or were killed)\n";
    const bool found = report_first_problem(out, ranks);
    if (!found) out << "  every rank issued and completed the same operations\n";
    result.found = result.found || found;
  }
  result.report = out.str();
  return result;
}

}  // namespace loom::trace
