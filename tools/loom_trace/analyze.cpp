#include "tools/loom_trace/analyze.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "tensor/error.h"

namespace loom::trace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string describe(const json& e) {
  std::ostringstream s;
  s << e.at("op").get<std::string>() << " " << e.at("bytes").get<int64_t>() << " B "
    << e.at("dtype").get<std::string>() << " (" << e.at("state").get<std::string>() << ")";
  return s.str();
}

std::string signature(const json& e) {
  return e.at("op").get<std::string>() + " " + std::to_string(e.at("bytes").get<int64_t>()) +
         " " + e.at("dtype").get<std::string>();
}

}  // namespace

Analysis analyze_flight_dumps(const fs::path& dir) {
  std::map<int, json> dumps;  // job rank -> dump
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("flight.rank-") || !name.ends_with(".json")) continue;
    std::ifstream in(entry.path());
    try {
      json dump = json::parse(in);
      const int rank = dump.at("rank").get<int>();
      dumps[rank] = std::move(dump);
    } catch (const std::exception& e) {
      fail("[loom-trace] ", entry.path().string(), " is not a flight-recorder dump: ", e.what());
    }
  }
  if (dumps.empty()) {
    fail("[loom-trace] no flight.rank-R.json in ", dir.string(),
         "; run the job with LOOM_FLIGHT_RECORDER_DIR=", dir.string(),
         " (ranks dump on a failure, or on SIGUSR1)");
  }
  // group -> job rank -> seq -> entry
  std::map<std::string, std::map<int, std::map<uint64_t, json>>> groups;
  std::map<std::string, int> group_sizes;
  for (const auto& [rank, dump] : dumps) {
    for (const json& e : dump.at("entries")) {
      const std::string group = e.at("group").get<std::string>();
      groups[group][rank][e.at("seq").get<uint64_t>()] = e;
      group_sizes[group] = e.at("group_size").get<int>();
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
    uint64_t from = 0, to = 0;  // the sequence numbers every dump still covers, and the last seen
    for (const auto& [rank, ops] : ranks) {
      from = std::max(from, ops.begin()->first);
      to = std::max(to, ops.rbegin()->first);
    }
    bool group_found = false;
    for (uint64_t seq = from; seq <= to && !group_found; ++seq) {
      std::map<int, const json*> at;
      for (const auto& [rank, ops] : ranks) {
        auto it = ops.find(seq);
        at[rank] = it == ops.end() ? nullptr : &it->second;
      }
      std::set<std::string> signatures;
      std::set<std::string> states;
      bool point_to_point = false, missing = false;
      for (const auto& [rank, e] : at) {
        if (e == nullptr) {
          missing = true;
          continue;
        }
        point_to_point = point_to_point || (*e).at("peer").get<int>() >= 0;
        signatures.insert(signature(*e));
        states.insert((*e).at("state").get<std::string>());
      }
      if (point_to_point) continue;
      auto list = [&](std::ostringstream& s) {
        for (const auto& [rank, e] : at) {
          s << "    rank " << rank << ": ";
          if (e != nullptr) {
            s << describe(*e);
            if (!(*e).at("error").get<std::string>().empty())
              s << ": " << (*e).at("error").get<std::string>();
          } else {
            const auto& ops = ranks.at(rank);
            auto last = ops.lower_bound(seq);
            s << "never issued it";
            if (last != ops.begin()) {
              --last;
              s << " (its last: seq " << last->first << ", " << describe(last->second) << ")";
            }
          }
          s << "\n";
        }
      };
      if (signatures.size() > 1) {
        out << "  seq " << seq << ": the ranks disagree on the operation:\n";
        list(out);
        group_found = true;
      } else if (missing) {
        out << "  seq " << seq << ": not every rank reached it:\n";
        list(out);
        group_found = true;
      } else if (states.size() > 1 || (states.count("completed") == 0)) {
        out << "  seq " << seq << ": issued everywhere but not completed everywhere:\n";
        list(out);
        group_found = true;
      }
    }
    if (!group_found) out << "  every rank issued and completed the same operations\n";
    result.found = result.found || group_found;
  }
  result.report = out.str();
  return result;
}

}  // namespace loom::trace
