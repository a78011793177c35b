#include "tools/loom_perf/runner.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>

#include "tools/loom_perf/checks.h"

namespace loom::perf {

namespace {

using comm::WorkPtr;

Tensor buffer(size_t count, DType dtype) {
  return Tensor::empty({static_cast<int64_t>(count)}, dtype);
}

// Buffers of one case: `count` elements in all (the size column), `per_rank` of them per
// rank for the split collectives.
CaseBuffers make_case(Collective c, bool in_place, DType dtype, size_t count, size_t per_rank,
                      int rank) {
  const auto slice = [&](const Tensor& t) {
    return t.narrow(0, static_cast<int64_t>(rank * per_rank), static_cast<int64_t>(per_rank));
  };
  CaseBuffers b;
  switch (c) {
    case Collective::AllGather:
      b.output = buffer(count, dtype);
      b.input = in_place ? slice(b.output) : buffer(per_rank, dtype);
      return b;
    case Collective::ReduceScatter:
      b.input = buffer(count, dtype);
      b.output = in_place ? slice(b.input) : buffer(per_rank, dtype);
      return b;
    case Collective::Barrier: b.input = b.output = buffer(0, dtype); return b;
    default:
      b.input = buffer(count, dtype);
      b.output = in_place ? b.input : buffer(count, dtype);
      return b;
  }
}

// Drops the handles of completed operations (rethrowing their errors), so that a burst of
// -z 0 holds only the operations still in flight, as a program that waits on its last
// operation or keeps a window of handles does; nccl-tests' -z 0 likewise only synchronizes
// its stream at the end. Once kKeep handles are held, each call pops the completed ones at
// the front and stops at the first still in flight: one check of a pending handle per call,
// however long a handle stays pending. (A vector scanned from its start every 64 calls, and
// cut only when half of it was done, cost 2.97 us a call in a 3-million-call run under perf
// record, a third of it in Work::is_completed: a handle had stayed pending a while, and each
// scan walked the completed ones before it.)
void release_completed(std::deque<WorkPtr>& works) {
  constexpr size_t kKeep = 64;
  while (works.size() >= kKeep && works.front()->is_completed()) {
    works.front()->wait();
    works.pop_front();
  }
}

// Issues one operation of the case (two for sendrecv) and appends its handles.
void issue(comm::ProcessGroup& pg, Collective c, CaseBuffers& b, const comm::CollectiveOptions& o,
           std::deque<WorkPtr>& works) {
  release_completed(works);
  switch (c) {
    case Collective::AllReduce:
      works.push_back(b.input.is_same(b.output) ? pg.allreduce(b.output, o)
                                                : pg.allreduce(b.input, b.output, o));
      return;
    case Collective::Broadcast: works.push_back(pg.broadcast(b.output, o)); return;
    case Collective::Reduce: works.push_back(pg.reduce(b.output, o)); return;
    case Collective::AllGather: works.push_back(pg.all_gather(b.output, b.input, o)); return;
    case Collective::ReduceScatter:
      works.push_back(pg.reduce_scatter(b.output, b.input, o));
      return;
    case Collective::AllToAll: works.push_back(pg.all_to_all(b.output, b.input, o)); return;
    case Collective::SendRecv: {
      // A ring: every rank sends to the next and receives from the previous. A send may
      // block until its receiver drains it, so odd ranks receive first to break the cycle.
      const int n = pg.size(), r = pg.rank();
      const int next = (r + 1) % n, prev = (r + n - 1) % n;
      const comm::P2POptions p2p{.tag = 0, .timeout = o.timeout, .async_op = o.async_op};
      if (r % 2 == 0) {
        works.push_back(pg.send(b.input, next, p2p));
        works.push_back(pg.recv(b.output, prev, p2p));
      } else {
        works.push_back(pg.recv(b.output, prev, p2p));
        works.push_back(pg.send(b.input, next, p2p));
      }
      return;
    }
    case Collective::Barrier: works.push_back(pg.barrier(o)); return;
  }
}

// The CPUs this process may run on, as ranges: "0-1", "3".
std::string allowed_cpus_text() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string text;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set))
      ++last;
    if (!text.empty()) text += ',';
    text += std::to_string(cpu);
    if (last > cpu) {
      text += '-';
      text += std::to_string(last);
    }
    cpu = last;
  }
  return text;
}

// The group runs operations in issue order, so once the last is done all are: waiting for
// it first wakes this thread once instead of once per operation (each wake-up would steal
// a core from the progress threads). Then each wait() returns at once, rethrowing errors.
void wait_all(std::deque<WorkPtr>& works) {
  if (!works.empty()) works.back()->wait();
  for (WorkPtr& w : works)
    w->wait();
  works.clear();
}

}  // namespace

Runner::Runner(std::shared_ptr<comm::ProcessGroup> pg, const PerfOptions& options)
    : pg_(std::move(pg)), options_(options), rank_(pg_->rank()), nranks_(pg_->size()) {
  if (options_.collective == Collective::SendRecv && nranks_ < 2) {
    fail("loom-perf sendrecv needs at least 2 ranks (a ring of send/recv); got ", nranks_,
         ": run it with --np N or under loomrun");
  }
  if (collective_info(options_.collective).rooted &&
      (options_.root < 0 || options_.root >= nranks_)) {
    fail("-r/--root ", options_.root, " is not a rank of this job (0 to ", nranks_ - 1, ")");
  }
}

std::vector<RankInfo> Runner::gather_ranks() {
  // Each rank's entry: pid, host name, allowed CPUs ("0-1"), fixed-size and zero-padded.
  constexpr size_t kTextBytes = 64;
  constexpr size_t kEntryBytes = sizeof(int64_t) + 2 * kTextBytes;
  Tensor mine = Tensor::zeros({static_cast<int64_t>(kEntryBytes)}, DType::U8);
  auto* bytes = static_cast<char*>(mine.raw_data());
  int64_t pid = ::getpid();
  std::memcpy(bytes, &pid, sizeof pid);
  ::gethostname(bytes + sizeof pid, kTextBytes - 1);
  std::string cpus = allowed_cpus_text();
  std::memcpy(bytes + sizeof pid + kTextBytes, cpus.data(), std::min(cpus.size(), kTextBytes - 1));
  Tensor all = Tensor::zeros({static_cast<int64_t>(nranks_ * kEntryBytes)}, DType::U8);
  pg_->all_gather(all, mine)->wait();
  std::vector<RankInfo> ranks;
  const auto* gathered = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < nranks_; ++r) {
    const char* entry = gathered + r * kEntryBytes;
    RankInfo info;
    info.rank = r;
    std::memcpy(&info.pid, entry, sizeof info.pid);
    info.host.assign(entry + sizeof pid, strnlen(entry + sizeof pid, kTextBytes));
    const char* cpu_text = entry + sizeof pid + kTextBytes;
    info.cpus.assign(cpu_text, strnlen(cpu_text, kTextBytes));
    ranks.push_back(info);
  }
  return ranks;
}

std::vector<Row> Runner::run(const std::function<void(const Row&)>& on_row) {
  std::vector<Row> rows;
  std::vector<size_t> sizes = size_list(options_);
  if (options_.collective == Collective::Barrier) sizes = {0};  // moves no data
  if (options_.compute_us > 0) compute_rounds_ = compute_rounds();
  uint32_t seed = 0;
  for (size_t bytes : sizes) {
    rows.push_back(measure_size(bytes, seed));
    seed += 2;
    if (on_row) on_row(rows.back());
  }
  return rows;
}

namespace {

// Keeps busy_work's result alive, and gives it a start the compiler cannot know.
volatile double busy_sink = 0;

// A fixed amount of arithmetic on this thread, in registers: a chain of dependent
// multiply-adds, which keeps one core busy for a time proportional to `rounds` and touches
// no memory. The chain starts from busy_sink, a volatile: from a constant start (1.0, a
// fixed point of the step) the compiler proved the value constant and removed the loop, and
// --compute-us computed nothing (until 2026-12-06).
double busy_work(int64_t rounds) {
  double a = busy_sink + 1.0;
  const double b = 1e-9;
  for (int64_t i = 0; i < rounds; ++i)
    a = a * (1.0 - b) + b;
  return a;
}

}  // namespace

int64_t Runner::compute_rounds() {
  using Clock = std::chrono::steady_clock;
  const auto time_us = [](int64_t rounds) {
    const auto start = Clock::now();
    busy_sink = busy_work(rounds);
    return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  };
  constexpr int64_t kProbe = int64_t{1} << 20;
  busy_sink = busy_work(kProbe);  // warm
  // A first estimate, then the fastest of three probes as long as an iteration's computation:
  // timed as the iterations are, so that a machine whose scheduler slices long runs (other
  // processes on the cores: the ranks' progress threads, other tests) slices both alike, and
  // one probe descheduled more than the others does not set the rate.
  int64_t rounds = static_cast<int64_t>(
      std::ceil(options_.compute_us * static_cast<double>(kProbe) / time_us(kProbe)));
  double best_us = std::numeric_limits<double>::infinity();
  for (int probe = 0; probe < 3; ++probe)
    best_us = std::min(best_us, time_us(rounds));
  const double scaled = std::ceil(options_.compute_us * static_cast<double>(rounds) / best_us);
  return static_cast<int64_t>(max_over_ranks(scaled));
}

Row Runner::measure_size(size_t requested_bytes, uint32_t seed) {
  const CollectiveInfo& info = collective_info(options_.collective);
  const size_t element = dtype_size(options_.dtype);
  size_t count = requested_bytes / element;
  size_t per_rank = count;
  if (info.split_across_ranks) {
    per_rank = count / static_cast<size_t>(nranks_);
    count = per_rank * static_cast<size_t>(nranks_);
  }
  Row row;
  row.bytes = count * element;
  row.count = count;
  if (info.out_of_place) row.out_of_place = measure(row.bytes, count, per_rank, false, seed);
  if (info.in_place) row.in_place = measure(row.bytes, count, per_rank, true, seed + 1);
  return row;
}

Measurement Runner::measure(size_t bytes, size_t count, size_t per_rank, bool in_place,
                            uint32_t seed) {
  using Clock = std::chrono::steady_clock;
  const CollectiveInfo& info = collective_info(options_.collective);
  // -z 1 makes every call synchronous (async_op = false), as a blocking caller would.
  const comm::CollectiveOptions o{
      .op = options_.op,
      .root = options_.root,
      .timeout = loom::Duration(static_cast<int64_t>(options_.timeout_s * 1000)),
      .async_op = !options_.blocking};
  CheckSpec spec{.collective = options_.collective,
                 .op = info.reduces ? options_.op : comm::ReduceOp::Sum,
                 .dtype = options_.dtype,
                 .rank = rank_,
                 .nranks = nranks_,
                 .root = options_.root,
                 .count = count,
                 .per_rank = per_rank};
  CaseBuffers buffers =
      make_case(options_.collective, in_place, options_.dtype, count, per_rank, rank_);
  // Real values even when not checking: garbage could hold NaNs or subnormals, which
  // change the speed of floating-point reductions.
  fill_case(spec, buffers, seed);

  std::deque<WorkPtr> works;
  for (int i = 0; i < options_.warmup_iters; ++i) {
    issue(*pg_, options_.collective, buffers, o, works);
    if (options_.blocking || options_.wait_each) wait_all(works);
  }
  wait_all(works);
  pg_->barrier(o)->wait();

  // Note [A call's cost to a computing rank]
  // With --compute-us, every rank first times its computation alone, all ranks computing at
  // once (each core busy, as in a training step whose ranks fill the cores), then the same
  // computation with a call issued before it and waited for after it. The difference is what
  // the call cost the computing rank: the core time its progress thread and its waits took
  // (hand-off, spin, wake-ups, the copies), plus any wait the computation did not cover.
  const int iters = std::max(options_.iters, 1);
  double alone_us = 0;
  if (compute_rounds_ > 0) {
    pg_->barrier(o)->wait();
    const auto alone = Clock::now();
    for (int i = 0; i < iters; ++i)
      busy_sink = busy_work(compute_rounds_);
    alone_us = std::chrono::duration<double, std::micro>(Clock::now() - alone).count() / iters;
    pg_->barrier(o)->wait();
  }
  // The computation runs in kSlices slices, and between them the rank looks whether its call
  // has completed: the first look that finds it done (or, if none does, the wait's return)
  // ends the call's completion time, to a slice's resolution. (Work is only read, so the
  // looks change nothing of the group's progress; they cost a load each.)
  constexpr int64_t kSlices = 32;
  double completion_sum_us = 0;
  auto start = Clock::now();
  for (int i = 0; i < options_.iters; ++i) {
    const auto issued = Clock::now();
    issue(*pg_, options_.collective, buffers, o, works);
    std::optional<Clock::time_point> completed;
    for (int64_t slice = 0; compute_rounds_ > 0 && slice < kSlices; ++slice) {
      busy_sink = busy_work(compute_rounds_ / kSlices);
      if (!completed && works.back()->is_completed()) completed = Clock::now();
    }
    if (options_.blocking || options_.wait_each) wait_all(works);
    if (compute_rounds_ > 0) {
      completion_sum_us += std::chrono::duration<double, std::micro>(
                               completed.value_or(Clock::now()) - issued).count();
    }
  }
  wait_all(works);
  double elapsed_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();

  Measurement m;
  m.time_us = max_over_ranks(elapsed_us / iters - alone_us);
  if (compute_rounds_ > 0) {
    m.completion_us = max_over_ranks(completion_sum_us / iters);
    m.compute_alone_us = max_over_ranks(alone_us);
  }
  m.algbw = m.time_us > 0 ? static_cast<double>(bytes) / m.time_us / 1e3 : 0.0;
  m.busbw = m.algbw * bus_factor(options_.collective, nranks_);

  if (options_.check) {
    fill_case(spec, buffers, seed + 1000);
    issue(*pg_, options_.collective, buffers, o, works);
    wait_all(works);
    m.wrong = sum_over_ranks(count_wrong(spec, buffers, seed + 1000));
  }
  return m;
}

double Runner::max_over_ranks(double value) {
  Tensor t = Tensor::full({1}, value, DType::F64);
  comm::CollectiveOptions max;
  max.op = comm::ReduceOp::Max;
  pg_->allreduce(t, max)->wait();
  return t.data<double>()[0];
}

int64_t Runner::sum_over_ranks(int64_t value) {
  Tensor t = Tensor::full({1}, static_cast<double>(value), DType::I64);
  pg_->allreduce(t)->wait();  // sum
  return t.data<int64_t>()[0];
}

}  // namespace loom::perf
