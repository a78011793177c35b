// The trace recorder (strategies/trace.h): events from several threads, the Chrome JSON it
// writes, atomic writes, and a 2-rank DDP run of train_gpt's loop whose trace shows the
// steps' spans and the buckets' communication overlapping backward.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/default_corpus.h"
#include "multiprocess.h"
#include "strategies/registry.h"
#include "strategies/trace.h"
#include "tools/train_gpt/trainer.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using namespace std::chrono_literals;
using nlohmann::json;

std::string temp_dir() {
  char dir_template[] = "/tmp/loom_trace_XXXXXX";
  return mkdtemp(dir_template);
}

// Trains the tiny GPT (2 blocks, embd 16, vocab 64, batch 2) for `steps` steps under
// `strategy` with a trace recording; writes rank `rank`'s trace beside `path` and returns
// where.
std::string train_traced(Strategy& strategy, int64_t steps, const std::string& path, int rank,
                         int size) {
  nn::GPTConfig c;
  c.vocab_size = 64;
  c.context = 8;
  c.layers = 2;
  c.heads = 2;
  c.embd = 16;
  nn::GPT model(c, 4);
  train_gpt::TrainOptions o;
  o.model = c;
  o.batch = 2;
  o.steps = steps;
  std::vector<uint8_t> bytes = data::default_corpus(1 << 12);
  for (uint8_t& b : bytes)
    b %= 64;
  data::TokenBlocks data(bytes, 2, 8, 64);
  Trace trace;
  set_current_trace(&trace);
  train_gpt::train(model, data, o, [](const train_gpt::StepMetrics&) {}, &strategy);
  set_current_trace(nullptr);
  const std::string written = trace_path_for_rank(path, rank, size);
  trace.write(written, rank);
  return written;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

TEST(Trace, RecordsFromTwoThreadsAndWritesChromeJson) {
  Trace trace;
  {
    Trace::Span outer(&trace, "outer", "test", Trace::kMainThread, {{"step", 7}});
    std::thread comm([&] {
      int64_t start = trace.now_us();
      std::this_thread::sleep_for(2ms);
      trace.complete("bucket 0 allreduce (16 bytes)", "ddp", start, trace.now_us() - start,
                     Trace::kCommThread, {{"bytes", 16}});
    });
    trace.instant("ready", "ddp", trace.now_us());
    comm.join();
  }
  Trace::Span null_span(nullptr, "ignored", "test");  // no trace: records nothing
  EXPECT_EQ(trace.event_count(), 3u);

  std::string dir = temp_dir();
  std::string path = dir + "/trace.json";
  trace.write(path, 3);
  // Atomic write: only the final file is left.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator{}),
            1);
  json doc = read_json(path);
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  const json& events = doc["traceEvents"];
  ASSERT_TRUE(events.is_array());
  // Metadata first: the process and the two threads.
  std::map<int, std::string> thread_names;
  std::string process_name;
  size_t first_real = 0;
  while (first_real < events.size() && events[first_real]["ph"] == "M") {
    const json& m = events[first_real++];
    EXPECT_EQ(m["pid"], 3);
    if (m["name"] == "process_name") process_name = m["args"]["name"];
    if (m["name"] == "thread_name") thread_names[m["tid"].get<int>()] = m["args"]["name"];
  }
  EXPECT_EQ(process_name, "rank 3");
  EXPECT_EQ(thread_names[0], "main");
  EXPECT_EQ(thread_names[1], "comm");
  ASSERT_EQ(events.size() - first_real, 3u);
  int64_t last_ts = -1;
  for (size_t i = first_real; i < events.size(); ++i) {
    const json& e = events[i];
    EXPECT_EQ(e["pid"], 3);
    EXPECT_GE(e["ts"].get<int64_t>(), last_ts) << "events sorted by start time";
    last_ts = e["ts"].get<int64_t>();
  }
  const json& outer = events[first_real];  // starts first
  EXPECT_EQ(outer["name"], "outer");
  EXPECT_EQ(outer["ph"], "X");
  EXPECT_EQ(outer["tid"], 0);
  EXPECT_EQ(outer["args"]["step"], 7);
  bool saw_comm = false, saw_instant = false;
  for (size_t i = first_real; i < events.size(); ++i) {
    const json& e = events[i];
    if (e["ph"] == "X" && e["tid"] == 1) {
      saw_comm = true;
      EXPECT_EQ(e["cat"], "ddp");
      EXPECT_GE(e["dur"].get<int64_t>(), 2000);
      EXPECT_EQ(e["args"]["bytes"], 16);
      // Inside the outer span.
      EXPECT_GE(e["ts"].get<int64_t>(), outer["ts"].get<int64_t>());
      EXPECT_LE(e["ts"].get<int64_t>() + e["dur"].get<int64_t>(),
                outer["ts"].get<int64_t>() + outer["dur"].get<int64_t>());
    }
    if (e["ph"] == "i") {
      saw_instant = true;
      EXPECT_EQ(e["s"], "t");
    }
  }
  EXPECT_TRUE(saw_comm);
  EXPECT_TRUE(saw_instant);
  std::filesystem::remove_all(dir);
}

TEST(Trace, WriteFailsLoudlyAndLeavesNothing) {
  Trace trace;
  EXPECT_THROW(trace.write("/nonexistent_dir_for_loom/trace.json", 0), Error);
}

TEST(Trace, PathPerRank) {
  EXPECT_EQ(trace_path_for_rank("trace.json", 1, 2), "trace.rank1.json");
  EXPECT_EQ(trace_path_for_rank("out/t.json", 0, 4), "out/t.rank0.json");
  EXPECT_EQ(trace_path_for_rank("a.b/trace", 1, 2), "a.b/trace.rank1");
  EXPECT_EQ(trace_path_for_rank("trace.json", 0, 1), "trace.json");
}

TEST(Trace, CurrentTraceIsProcessWide) {
  EXPECT_EQ(current_trace(), nullptr);
  Trace trace;
  set_current_trace(&trace);
  Trace* seen = nullptr;
  std::thread([&] { seen = current_trace(); }).join();
  EXPECT_EQ(seen, &trace);
  set_current_trace(nullptr);
}

// A 2-rank DDP run of train_gpt's loop with a trace: per-step forward/backward/optimizer
// spans on the main row, one allreduce span per bucket per step on the comm rows, and
// a bucket launched before its step's backward span ended (overlap with backward).
TEST(Trace, DDPTrainingShowsStepsAndBucketsOverlappingBackward) {
  const int world = 2;
  const int64_t steps = 3;
  std::string dir = temp_dir();
  expect_all_ok(run_ranks(world, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    options.ddp.bucket_cap_mb = 0.004;  // several buckets for this tiny model
    options.ddp.first_bucket_mb = 0.002;
    auto ddp = StrategyRegistry::create("ddp", options);
    auto* parallel = dynamic_cast<ParallelStrategy*>(ddp.get());
    parallel->set_process_group(std::make_shared<comm::ProcessGroup>(
        rank, size, store, comm::GroupOptions{.timeout = 30s}));
    ddp->setup_environment();
    const std::string path = train_traced(*ddp, steps, dir + "/trace.json", rank, size);

    json doc = read_json(path);
    std::map<std::string, std::vector<json>> main_spans;  // by name
    std::vector<json> buckets;
    std::map<int, std::string> thread_names;
    for (const json& e : doc["traceEvents"]) {
      EXPECT_EQ(e["pid"], rank);
      if (e["ph"] == "M" && e["name"] == "thread_name") {
        thread_names[e["tid"].get<int>()] = e["args"]["name"];
      }
      if (e["ph"] != "X") continue;
      if (e["tid"] == 0) main_spans[e["name"].get<std::string>()].push_back(e);
      std::string name = e["name"];
      if (name.find("allreduce (") != std::string::npos) {
        EXPECT_GE(e["tid"].get<int>(), 1) << name;
        EXPECT_EQ(thread_names[e["tid"].get<int>()].rfind("comm", 0), 0u) << name;
        buckets.push_back(e);
      }
    }
    for (const char* name : {"forward", "backward", "optimizer"}) {
      ASSERT_EQ(main_spans[name].size(), static_cast<size_t>(steps)) << name;
      for (int64_t s = 0; s < steps; ++s)
        EXPECT_EQ(main_spans[name][s]["args"]["step"], s) << name;
    }
    const size_t per_step = buckets.size() / steps;
    ASSERT_GE(per_step, 2u) << "expected several buckets";
    ASSERT_EQ(buckets.size(), per_step * steps);
    EXPECT_TRUE(std::any_of(buckets.begin(), buckets.end(), [](const json& b) {
      return b["tid"] == 1 && b["name"].get<std::string>().rfind("bucket 0 allreduce", 0) == 0;
    }));
    // A bucket's span is its communication as it happened; it was launched queued_us before.
    auto launched_at = [](const json& b) {
      return b["ts"].get<int64_t>() - b["args"]["queued_us"].get<int64_t>();
    };
    for (int64_t s = 0; s < steps; ++s) {
      const json& backward = main_spans["backward"][s];
      const int64_t b_start = backward["ts"], b_end = b_start + backward["dur"].get<int64_t>();
      int launched_during_backward = 0;
      std::vector<const json*> of_step;
      for (const json& b : buckets) {
        int64_t ts = launched_at(b);
        if (ts >= b_start && ts < b_end) {
          ++launched_during_backward;
          of_step.push_back(&b);
        }
      }
      // One group runs its operations one after another: each bucket's communication ends
      // before the next one's starts (not all at the moment the main thread looked).
      std::sort(of_step.begin(), of_step.end(), [](const json* x, const json* y) {
        return (*x)["args"]["bucket"].get<int64_t>() < (*y)["args"]["bucket"].get<int64_t>();
      });
      for (size_t i = 1; i < of_step.size(); ++i) {
        const json& before = *of_step[i - 1];
        EXPECT_LE(before["ts"].get<int64_t>() + before["dur"].get<int64_t>(),
                  (*of_step[i])["ts"].get<int64_t>())
            << "step " << s << ", bucket " << i;
      }
      EXPECT_EQ(launched_during_backward, static_cast<int>(per_step)) << "step " << s;
      // Overlap evidence: bucket 0 went out before the backward pass's last gradient, i.e.
      // before the reducer started waiting ("ddp wait for buckets" begins after autograd).
      int64_t first_launch = b_end;
      for (const json& b : buckets) {
        int64_t ts = launched_at(b);
        if (ts >= b_start && ts < b_end) first_launch = std::min(first_launch, ts);
      }
      int64_t wait_start = b_end;
      for (const json& w : main_spans["ddp wait for buckets"]) {
        int64_t ts = w["ts"];
        if (ts >= b_start && ts < b_end) wait_start = ts;
      }
      EXPECT_LT(first_launch, b_end) << "step " << s;
      EXPECT_LE(first_launch, wait_start) << "step " << s;
    }
  }));
  EXPECT_TRUE(std::filesystem::exists(dir + "/trace.rank0.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/trace.rank1.json"));
  std::filesystem::remove_all(dir);
}

TEST(Trace, ShardedTrainingShowsEachUnitsAllGatherAndReduceScatter) {
  const int64_t steps = 2;
  std::string dir = temp_dir();
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    options.sharding.auto_wrap_policy = "Block";
    options.sharding.forward_prefetch = true;
    auto fsdp = StrategyRegistry::create("fsdp", options);
    dynamic_cast<ParallelStrategy&>(*fsdp).set_process_group(std::make_shared<comm::ProcessGroup>(
        rank, size, store, comm::GroupOptions{.timeout = 30s}));
    fsdp->setup_environment();
    const std::string path = train_traced(*fsdp, steps, dir + "/sharded.json", rank, size);

    // Units: 0 the root, 1 and 2 the blocks. Each step gathers every unit for forward, the
    // blocks again for backward (the root stays gathered), and reduce-scatters every unit;
    // train() ends by gathering the whole model once more (gather_full_module).
    std::map<std::string, int> count;
    std::map<int, std::vector<std::pair<int64_t, int64_t>>> comm_rows;
    const json doc = read_json(path);
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] != "X" || e["cat"] != "sharded") continue;
      const std::string name = e["name"];
      if (name.rfind("wait ", 0) == 0) {
        EXPECT_EQ(e["tid"], 0) << name;
        continue;
      }
      EXPECT_GE(e["tid"].get<int>(), 1) << name;
      // Timed as DDP's buckets are: when it really ran, after queued_us in the group's queue.
      EXPECT_GE(e["args"].value("queued_us", int64_t{-1}), 0) << name;
      comm_rows[e["tid"].get<int>()].emplace_back(e["ts"].get<int64_t>(),
                                                 e["ts"].get<int64_t>() + e["dur"].get<int64_t>());
      count[name.substr(0, name.find(" ("))]++;
    }
    EXPECT_EQ(count["unit 0 all-gather"], steps + 1);
    EXPECT_EQ(count["unit 1 all-gather"], 2 * steps + 1);
    EXPECT_EQ(count["unit 2 all-gather"], 2 * steps + 1);
    for (const char* unit : {"unit 0 reduce-scatter", "unit 1 reduce-scatter",
                             "unit 2 reduce-scatter"})
      EXPECT_EQ(count[unit], steps) << unit;
    for (auto& [tid, spans] : comm_rows) {  // no two spans overlap on one row
      std::sort(spans.begin(), spans.end());
      for (size_t i = 1; i < spans.size(); ++i)
        EXPECT_LE(spans[i - 1].second, spans[i].first) << "row " << tid;
    }
  }));
  std::filesystem::remove_all(dir);
}

// Pipeline 2 x dp 2 on 4 ranks: each stage's replicas average through DDP's reducer, so the
// trace shows its buckets on the comm rows, every one launched inside the stage's last
// backward action of its step ("B1", micro-batch 1 of 2), overlapping it, as DDP's are.
TEST(Trace, PipelineReplicasAverageThroughTheReducersBuckets) {
  const int64_t steps = 2;
  std::string dir = temp_dir();
  expect_all_ok(run_ranks(4, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    options.pipeline.stages = 2;
    options.pipeline.micro_batches = 2;
    auto pipeline = StrategyRegistry::create("pipeline", options);
    dynamic_cast<ParallelStrategy&>(*pipeline)
        .set_process_group(std::make_shared<comm::ProcessGroup>(
            rank, size, store, comm::GroupOptions{.timeout = 60s}));
    pipeline->setup_environment();
    const std::string path = train_traced(*pipeline, steps, dir + "/pipeline.json", rank, size);
    pipeline->teardown();

    std::vector<std::pair<int64_t, int64_t>> last_backwards;  // [start, end) per step
    std::vector<int64_t> launches;
    const json doc = read_json(path);
    for (const json& e : doc["traceEvents"]) {
      if (e["ph"] != "X") continue;
      const std::string name = e["name"];
      if (name == "B1" && e["cat"] == "pipeline") {
        const int64_t ts = e["ts"];
        last_backwards.emplace_back(ts, ts + e["dur"].get<int64_t>());
      }
      if (name.rfind("bucket ", 0) == 0 && name.find(" allreduce (") != std::string::npos) {
        EXPECT_GE(e["tid"].get<int>(), 1) << name;
        launches.push_back(e["ts"].get<int64_t>() - e["args"]["queued_us"].get<int64_t>());
      }
    }
    ASSERT_EQ(last_backwards.size(), static_cast<size_t>(steps)) << "rank " << rank;
    ASSERT_GE(launches.size(), static_cast<size_t>(steps)) << "rank " << rank;
    for (int64_t launched : launches) {
      const bool inside = std::any_of(
          last_backwards.begin(), last_backwards.end(),
          [&](const auto& b) { return launched >= b.first && launched <= b.second; });
      EXPECT_TRUE(inside) << "rank " << rank << ": a bucket launched at " << launched
                          << " us, outside the last backward action of every step";
    }
  }, 120s));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom::strategies
