// The flight recorder (comm/flight_recorder.h) and loom-trace analyze on real jobs of two
// forked ranks: one that stalls (rank 1 skips a collective: rank 0 times out and dumps,
// rank 1 dumps on SIGUSR1) and one whose ranks disagree on a collective's dtype. Then
// analyze on hand-written dumps that are malformed: each error names the file, the entry
// and the field.

#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "comm/error.h"
#include "comm/flight_recorder.h"
#include "comm/process_group.h"
#include "comm/store/in_process_store.h"
#include "multiprocess.h"
#include "test_support.h"
#include "tools/loom_trace/analyze.h"

namespace loom::comm {
namespace {

using testing::expect_all_ok;
using testing::run_ranks;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// A temporary directory named in LOOM_FLIGHT_RECORDER_DIR, which the ranks inherit.
class DumpDir : public loom::testing::TempDir {
 public:
  DumpDir() : TempDir("loom-flight") { ::setenv("LOOM_FLIGHT_RECORDER_DIR", path().c_str(), 1); }
  ~DumpDir() { ::unsetenv("LOOM_FLIGHT_RECORDER_DIR"); }
};

void wait_for_file(const fs::path& path) {
  for (int i = 0; i < 500 && !fs::exists(path); ++i)
    std::this_thread::sleep_for(10ms);
}

TEST(FlightRecorder, AStalledJobNamesTheCollectiveOneRankNeverReached) {
  DumpDir dir;
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup group(rank, size, store, GroupOptions{.timeout = 1s}, "stall");
    Tensor t = Tensor::full({4}, 1.0);
    group.allreduce(t)->wait();
    group.allreduce(t)->wait();
    if (rank == 1) {  // leaves the job "hanging" at its third collective: dumps on SIGUSR1
      ::raise(SIGUSR1);
      wait_for_file(fs::path(dir.path()) / "flight.rank-1.json");
      return;
    }
    EXPECT_THROW(group.allreduce(t)->wait(), CommError);  // times out, dumps by itself
  }));
  ASSERT_TRUE(fs::exists(fs::path(dir.path()) / "flight.rank-0.json"));
  ASSERT_TRUE(fs::exists(fs::path(dir.path()) / "flight.rank-1.json"));
  const trace::Analysis a = trace::analyze_flight_dumps(dir.path());
  EXPECT_TRUE(a.found) << a.report;
  EXPECT_NE(a.report.find("seq 2: not every rank reached it"), std::string::npos) << a.report;
  EXPECT_NE(a.report.find("rank 1: never issued it (its last: seq 1, allreduce 16 B f32 "
                          "(completed))"),
            std::string::npos)
      << a.report;
  EXPECT_NE(a.report.find("rank 0: allreduce 16 B f32 (failed)"), std::string::npos) << a.report;
  std::printf("%s", a.report.c_str());
}

TEST(FlightRecorder, RanksThatDisagreeOnACollectiveAreNamed) {
  DumpDir dir;
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup group(rank, size, store, GroupOptions{.timeout = 5s}, "mismatch");
    Tensor same = Tensor::full({4}, 1.0);
    group.allreduce(same)->wait();
    // The same bytes, another dtype: the shm backend refuses it (Note [Fingerprints]) and the
    // recorder's dumps name it too.
    Tensor odd = rank == 0 ? Tensor::full({4}, 1.0) : Tensor::full({4}, 1.0, DType::I32);
    EXPECT_THROW(group.allreduce(odd)->wait(), CommError);
    FlightRecorder::global().dump(
        fs::path(dir.path()) / ("flight.rank-" + std::to_string(rank) + ".json"), rank);
  }));
  const trace::Analysis a = trace::analyze_flight_dumps(dir.path());
  EXPECT_TRUE(a.found) << a.report;
  EXPECT_NE(a.report.find("seq 1: the ranks disagree on the operation"), std::string::npos)
      << a.report;
  EXPECT_NE(a.report.find("rank 1: allreduce 16 B i32"), std::string::npos) << a.report;
}

// Records take no lock (Note [Lock-free records]): a dump taken while two groups' logs are
// written, each wrapping its ring many times, holds each entry whole or leaves it out. Every
// recorded label here ties its fields together (bytes = 8 x seq; allreduce is f32, broadcast
// bf16), so a torn read shows as a mismatch; under TSan, a race on a field is a report.
TEST(FlightRecorder, DumpsTakenWhileRecordingHoldWholeEntries) {
  FlightRecorder& recorder = FlightRecorder::global();
  if (!recorder.enabled()) GTEST_SKIP() << "LOOM_FLIGHT_RECORDER=0";
  const std::string names[] = {"torn-read-check-a", "torn-read-check-b"};
  FlightRecorder::Log* logs[] = {&recorder.register_group(names[0], 0, 1),
                                 &recorder.register_group(names[1], 0, 1)};
  // Each writer goes on until the reader has finished 3 dumps since the writer began (and it
  // wrapped its ring 3 times), so that at least 2 whole dumps ran while it wrote. Counting from
  // the writer's own start matters: a writer thread scheduled late would otherwise find the
  // dumps already done (taken over its empty ring), write alone and leave no entry checked.
  std::atomic<int> dumps{0};
  std::atomic<bool> done{false};
  auto write = [&](FlightRecorder::Log* log) {
    const int dumps_before = dumps.load();
    for (uint64_t seq = 0; dumps.load() < dumps_before + 3 || seq < 3 * kFlightCapacity; ++seq) {
      const bool even = seq % 2 == 0;
      const OpLabel label{.kind = even ? "allreduce" : "broadcast",
                          .seq = seq,
                          .bytes = seq * 8,
                          .dtype = even ? "f32" : "bf16",
                          .peer = -1,
                          .to_peer = false};
      log->record(label, std::chrono::steady_clock::now());
      log->completed(seq, std::chrono::steady_clock::now());
    }
  };
  std::thread a(write, logs[0]), b(write, logs[1]);
  std::map<std::string, int64_t> checked;
  std::thread reader([&] {
    while (!done.load()) {
      const auto dump = nlohmann::json::parse(recorder.json(0));
      for (const auto& e : dump.at("entries")) {
        const std::string group = e.at("group");
        if (group != names[0] && group != names[1]) continue;
        const uint64_t seq = e.at("seq");
        EXPECT_EQ(e.at("bytes").get<uint64_t>(), seq * 8) << e.dump();
        EXPECT_EQ(e.at("op"), seq % 2 == 0 ? "allreduce" : "broadcast") << e.dump();
        EXPECT_EQ(e.at("dtype"), seq % 2 == 0 ? "f32" : "bf16") << e.dump();
        ++checked[group];
      }
      ++dumps;
    }
  });
  a.join();
  b.join();
  done = true;
  reader.join();
  EXPECT_GT(checked[names[0]], 0) << "no dump saw an entry of the first writer";
  EXPECT_GT(checked[names[1]], 0) << "no dump saw an entry of the second writer";
}

// A dump keeps the last kFlightCapacity operations of each group, oldest first, with the
// error of a failed one; a busy group does not evict a quiet one's.
TEST(FlightRecorder, EachGroupKeepsItsLastOperations) {
  FlightRecorder& recorder = FlightRecorder::global();
  if (!recorder.enabled()) GTEST_SKIP() << "LOOM_FLIGHT_RECORDER=0";
  FlightRecorder::Log& quiet = recorder.register_group("keeps-quiet", 1, 2);
  FlightRecorder::Log& busy = recorder.register_group("keeps-busy", 0, 2);
  const auto now = std::chrono::steady_clock::now();
  quiet.record({.kind = "barrier", .seq = 0, .bytes = 0, .dtype = "", .peer = -1, .to_peer = false},
               now, /*started=*/true);
  quiet.completed(0, now, "peer 0 died");
  const uint64_t total = kFlightCapacity + 5;
  for (uint64_t seq = 0; seq < total; ++seq) {
    busy.record({.kind = "send", .seq = seq, .bytes = 4, .dtype = "u8", .peer = 1, .to_peer = true},
                now);
    if (seq == total - 2) busy.started(seq, now);
    if (seq < total - 2) busy.completed(seq, now);
  }
  busy.completed(3, now);  // long overwritten: nothing changes
  const auto dump = nlohmann::json::parse(recorder.json(0));
  std::vector<nlohmann::json> quiet_entries, busy_entries;
  for (const auto& e : dump.at("entries")) {
    if (e.at("group") == "keeps-quiet") quiet_entries.push_back(e);
    if (e.at("group") == "keeps-busy") busy_entries.push_back(e);
  }
  ASSERT_EQ(quiet_entries.size(), 1u);
  EXPECT_EQ(quiet_entries[0].at("state"), "failed");
  EXPECT_EQ(quiet_entries[0].at("error"), "peer 0 died");
  EXPECT_EQ(quiet_entries[0].at("group_rank"), 1);
  ASSERT_EQ(busy_entries.size(), kFlightCapacity);
  for (size_t i = 0; i < busy_entries.size(); ++i)
    EXPECT_EQ(busy_entries[i].at("seq").get<uint64_t>(), total - kFlightCapacity + i);
  EXPECT_EQ(busy_entries.back().at("state"), "queued");
  EXPECT_EQ(busy_entries[kFlightCapacity - 2].at("state"), "started");
  EXPECT_EQ(busy_entries.front().at("state"), "completed");
  EXPECT_EQ(busy_entries.front().at("op"), "send");
  EXPECT_EQ(busy_entries.front().at("peer"), 1);
}

// A destroyed group's log stays in dumps while it is among the last kClosedFlightLogs
// closed; older ones are freed.
TEST(FlightRecorder, DumpsKeepTheLastDestroyedGroups) {
  FlightRecorder& recorder = FlightRecorder::global();
  if (!recorder.enabled()) GTEST_SKIP() << "LOOM_FLIGHT_RECORDER=0";
  const size_t closed = kClosedFlightLogs + 3;
  for (size_t i = 0; i < closed; ++i) {
    FlightRecorder::Log& log = recorder.register_group("closed-" + std::to_string(i), 0, 1);
    log.record({.kind = "barrier", .seq = 0, .bytes = 0, .dtype = "", .peer = -1, .to_peer = false},
               std::chrono::steady_clock::now());
    recorder.close_group(log);
  }
  FlightRecorder::Log& open = recorder.register_group("still-open", 0, 1);
  open.record({.kind = "barrier", .seq = 0, .bytes = 0, .dtype = "", .peer = -1, .to_peer = false},
              std::chrono::steady_clock::now());
  const auto dump = nlohmann::json::parse(recorder.json(0));
  std::set<std::string> groups;
  for (const auto& e : dump.at("entries"))
    groups.insert(e.at("group").get<std::string>());
  for (size_t i = 0; i < closed; ++i) {
    const bool kept = i >= closed - kClosedFlightLogs;
    EXPECT_EQ(groups.count("closed-" + std::to_string(i)), kept ? 1u : 0u) << i;
  }
  EXPECT_EQ(groups.count("still-open"), 1u);
}

// A dump directory that cannot be used is refused when the group is made, naming the
// variable, not found out when a collective fails and the dump is needed.
TEST(FlightRecorder, AnUnusableDumpDirectoryIsRefusedAtStartUp) {
  const fs::path dir = fs::temp_directory_path() / ("loom-fr-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "a-file") << "x";
  const std::string under_a_file = (dir / "a-file" / "dumps").string();
  ::setenv("LOOM_FLIGHT_RECORDER_DIR", under_a_file.c_str(), 1);
  try {
    ProcessGroup pg(0, 1, std::make_shared<InProcessStore>(), {.backend = "shm"});
    ADD_FAILURE() << "a group was made with LOOM_FLIGHT_RECORDER_DIR under a regular file";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("LOOM_FLIGHT_RECORDER_DIR='" + under_a_file + "' cannot be created"),
              std::string::npos)
        << what;
  }
  const std::string usable = (dir / "dumps").string();
  ::setenv("LOOM_FLIGHT_RECORDER_DIR", usable.c_str(), 1);
  { ProcessGroup pg(0, 1, std::make_shared<InProcessStore>(), {.backend = "shm"}); }
  EXPECT_TRUE(fs::is_directory(usable));
  ::unsetenv("LOOM_FLIGHT_RECORDER_DIR");
  fs::remove_all(dir);
}

TEST(FlightRecorder, NoDumpsIsAClearError) {
  const fs::path empty = fs::temp_directory_path();
  try {
    trace::analyze_flight_dumps(empty / "loom-no-such-dir");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LOOM_FLIGHT_RECORDER_DIR"), std::string::npos);
  }
}

// "[" + entries + "]": a JSON array of entries.
std::string in_brackets(const std::string& entries) {
  return "[" + entries + "]";
}

// A well-formed entry of rank `rank`'s dump, with `field` replaced by `value` (a JSON text).
std::string entry(int rank, const std::string& field = "", const std::string& value = "") {
  std::map<std::string, std::string> fields = {{"group", "\"default.attempt0\""},
                                               {"group_rank", std::to_string(rank)},
                                               {"group_size", "2"},
                                               {"seq", "1"},
                                               {"op", "\"allreduce\""},
                                               {"bytes", "16"},
                                               {"dtype", "\"f32\""},
                                               {"peer", "-1"},
                                               {"state", "\"completed\""},
                                               {"queued_us", "0"},
                                               {"started_us", "1"},
                                               {"completed_us", "2"},
                                               {"error", "\"\""}};
  if (!field.empty()) fields[field] = value;
  std::string text = "{";
  for (const auto& [name, json] : fields) {
    if (json.empty()) continue;  // an empty value drops the field
    text += (text.size() > 1 ? ", \"" : "\"") + name + "\": " + json;
  }
  return text + "}";
}

std::string dump_text(int rank, const std::string& entries) {
  return "{\"rank\": " + std::to_string(rank) + ", \"entries\": " + entries + "}";
}

// Writes rank 0's dump `rank0` (and a well-formed rank 1 dump, unless `rank1` says otherwise)
// and returns analyze's error.
std::string analyze_error(const std::string& rank0,
                          const std::string& rank1 = dump_text(1, in_brackets(entry(1)))) {
  loom::testing::TempDir dir("loom-trace");
  std::ofstream(dir.path() / "flight.rank-0.json") << rank0;
  std::ofstream(dir.path() / "flight.rank-1.json") << rank1;
  return loom::testing::error_of([&] { trace::analyze_flight_dumps(dir.path()); });
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LoomTraceAnalyze, MalformedDumpsNameTheFileTheEntryAndTheField) {
  struct Case {
    std::string dump;
    std::vector<std::string> expected;  // every one appears in the error
  };
  const std::vector<Case> cases = {
      {"{ nope", {"flight.rank-0.json is not a flight-recorder dump (not JSON)"}},
      {"[]", {"flight.rank-0.json: the file holds [] (array), not a JSON object"}},
      {"{\"entries\": []}", {"flight.rank-0.json: no 'rank' field"}},
      {dump_text(-3, "[]"), {"'rank' is -3 (number); expected an integer from 0 to"}},
      {"{\"rank\": \"0\", \"entries\": []}", {"'rank' is \"0\" (string)"}},
      {dump_text(0, "5"), {"flight.rank-0.json: 'entries' is 5 (number); expected a list"}},
      {dump_text(0, "[5]"), {"entry 0: the entry is 5 (number); expected an object"}},
      {dump_text(0, in_brackets(entry(0) + ", " + entry(0, "op", "5"))),
       {"flight.rank-0.json: entry 1: 'op' is 5 (number); expected a string"}},
      {dump_text(0, in_brackets(entry(0, "seq", "-1"))),
       {"entry 0: 'seq' is -1 (number); expected an integer from 0 to 18446744073709551615"}},
      {dump_text(0, in_brackets(entry(0, "seq", "1.5"))), {"'seq' is 1.5 (number)"}},
      {dump_text(0, in_brackets(entry(0, "bytes", "\"16\""))),
       {"entry 0: 'bytes' is \"16\" (string); expected an integer from 0 to"}},
      {dump_text(0, in_brackets(entry(0, "group_size", "0"))),
       {"entry 0: 'group_size' is 0 (number); expected an integer from 1 to"}},
      {dump_text(0, in_brackets(entry(0, "group_rank", "2"))),
       {"entry 0: 'group_rank' 2 is not below 'group_size' 2"}},
      {dump_text(0, in_brackets(entry(0, "peer", "-2"))), {"'peer' is -2 (number)"}},
      {dump_text(0, in_brackets(entry(0, "group", ""))), {"entry 0: no 'group' field"}},
      {dump_text(0, in_brackets(entry(0, "state", "null"))), {"'state' is null (null)"}},
  };
  for (const Case& c : cases) {
    const std::string what = analyze_error(c.dump);
    EXPECT_TRUE(has(what, "[loom-trace] ")) << what;
    EXPECT_TRUE(has(what, "flight.rank-0.json")) << what;
    for (const std::string& part : c.expected)
      EXPECT_TRUE(has(what, part)) << "'" << part << "' not in: " << what;
  }
}

TEST(LoomTraceAnalyze, TwoDumpsOfOneRankAreAnError) {
  const std::string what =
      analyze_error(dump_text(0, in_brackets(entry(0))), dump_text(0, in_brackets(entry(0))));
  EXPECT_TRUE(has(what, "rank 0 has two dumps")) << what;
  EXPECT_TRUE(has(what, "flight.rank-0.json and ")) << what;
  EXPECT_TRUE(has(what, "flight.rank-1.json")) << what;
}

TEST(LoomTraceAnalyze, TheLargestSequenceNumberEndsTheScan) {
  // Every rank at seq 2^64 - 1 only, and agreeing: the scan must stop there, not wrap to 0.
  loom::testing::TempDir dir("loom-trace");
  const std::string last = "18446744073709551615";
  std::ofstream(dir.path() / "flight.rank-0.json")
      << dump_text(0, in_brackets(entry(0, "seq", last)));
  std::ofstream(dir.path() / "flight.rank-1.json")
      << dump_text(1, in_brackets(entry(1, "seq", last)));
  const trace::Analysis a = trace::analyze_flight_dumps(dir.path());
  EXPECT_FALSE(a.found) << a.report;
  EXPECT_TRUE(has(a.report, "every rank issued and completed the same operations")) << a.report;
}

}  // namespace
}  // namespace loom::comm
