// libnccl for the ranks of one host, each a process with an emulated GPU (whose memory is the
// process's own): the NCCL calls Loom makes (comm/nccl/), with NCCL's semantics, moving real
// data between the processes, so that the nccl backend and the strategies over it run with
// several ranks where there is no GPU (docs/cuda.md, "NCCL between emulated devices"). A call
// Loom does not make is a link error, not a silent success.
//
// Note [Emulated NCCL]
// A communicator is a board: a shared-memory segment named after its unique id (a split's
// child: after its parent's name, the split's number and the color) that each rank maps when
// it joins, and that is unlinked as soon as every rank has joined, so no board outlives its
// processes. Work is done when it is issued, as everything on the emulated device:
//  - A collective is the communicator's next number s. Each rank publishes the bytes it
//    contributes in a segment of its own (board name.s.rank), marks itself arrived at s + 1,
//    waits for every rank to arrive, reads what it needs from the others' segments, marks
//    itself left at s + 1 and removes its segment once every rank has left. Reductions run in
//    rank order in the element type (16-bit floats through f32, rounded to nearest even after
//    each rank); an average is that sum divided by the count (NCCL pre-multiplies floating
//    inputs by 1/n: the same bits for 2 ranks, not always for more).
//  - A send is the next message of its (source, destination) pair, a segment the receiver
//    reads and removes. Sends never wait, so a group (ncclGroupStart/End on this thread) runs
//    its sends first and then the rest in issue order, and grouped calls complete in any order
//    NCCL accepts. ncclCommFinalize waits until this rank's messages are taken; an abort
//    removes the ones that are not.
//  - Nothing waits forever: a wait fails with ncclRemoteError when a peer's process has exited,
//    a peer aborted the communicator, or LOOM_EMULATED_NCCL_TIMEOUT_S seconds (default 300)
//    passed. The error stays on the communicator (ncclCommGetAsyncError, every later call)
//    with a message for ncclGetLastError that names the ranks.
// Creation is non-blocking when the config asks (Loom's does): ncclCommInitRankConfig returns
// ncclInProgress and the communicator stays in progress until every rank has joined its
// board; ncclCommSplit, as NCCL 2.28 does, returns ncclSuccess with the parent in progress and
// fills the new handle when a poll of the parent finds the split done. Not emulated: NCCL
// calls on a capturing stream (ncclInvalidUsage), more than kMaxRanks ranks, fp8 types.

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "late_copies.h"
#include "stream_order.h"

namespace loom::cuda_emulation::nccl {
namespace {

constexpr int kMaxRanks = 64;

// The shared state of one communicator. Zero-filled by ftruncate, which is every field's
// initial value.
struct Board {
  std::atomic<int32_t> joined;
  std::atomic<int32_t> aborted_by;  // 1 + the rank that aborted, 0 while none has
  std::atomic<int32_t> pids[kMaxRanks];
  std::atomic<uint64_t> arrived[kMaxRanks];  // per rank: collectives published
  std::atomic<uint64_t> left[kMaxRanks];     // per rank: collectives done reading
  std::atomic<uint64_t> sent[kMaxRanks][kMaxRanks];   // [source][destination]: messages posted
  std::atomic<uint64_t> taken[kMaxRanks][kMaxRanks];  // [source][destination]: messages read
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free);

// A failure inside a call: what the call returns and what ncclGetLastError then says.
struct Failure {
  ncclResult_t result;
  std::string message;
};

template <typename... Parts>
[[noreturn]] void fail(ncclResult_t result, const Parts&... parts) {
  std::string message;
  ((message += parts), ...);
  throw Failure{result, std::move(message)};
}

std::string str(long long value) { return std::to_string(value); }

std::chrono::seconds wait_limit() {
  const char* text = std::getenv("LOOM_EMULATED_NCCL_TIMEOUT_S");
  const long seconds = text != nullptr ? std::strtol(text, nullptr, 10) : 0;
  return std::chrono::seconds(seconds > 0 ? seconds : 300);
}

// A shared-memory segment mapped into this process; unmapped when it goes.
class Mapping {
 public:
  Mapping() = default;
  Mapping(const std::string& name, size_t bytes, bool create) : name_(name) {
    const int fd = shm_open(name.c_str(), create ? O_CREAT | O_RDWR : O_RDWR, 0600);
    if (fd < 0) fail(ncclSystemError, "shm_open(", name, "): ", std::strerror(errno));
    struct stat info {};
    if ((create && ftruncate(fd, static_cast<off_t>(bytes)) != 0) || fstat(fd, &info) != 0) {
      const int error = errno;
      close(fd);
      fail(ncclSystemError, "sizing ", name, ": ", std::strerror(error));
    }
    bytes_ = static_cast<size_t>(info.st_size);
    if (bytes_ > 0) {
      data_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (data_ == MAP_FAILED) {
        data_ = nullptr;
        const int error = errno;
        close(fd);
        fail(ncclSystemError, "mmap(", name, "): ", std::strerror(error));
      }
    }
    close(fd);
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
    if (unlink_) shm_unlink(name_.c_str());
  }
  Mapping(Mapping&& other) noexcept
      : name_(std::move(other.name_)),
        data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        unlink_(std::exchange(other.unlink_, false)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    std::swap(name_, other.name_);
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    std::swap(unlink_, other.unlink_);
    return *this;
  }

  // The name goes with the mapping (a segment only this owner may remove).
  void unlink_when_closed() { unlink_ = true; }

  std::byte* data() const { return static_cast<std::byte*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool unlink_ = false;
};

// The bytes one rank publishes: a segment of its own, made with them and unlinked with it.
Mapping publish(const std::string& name, const void* data, size_t bytes) {
  Mapping segment(name, bytes, true);
  if (bytes > 0) std::memcpy(segment.data(), data, bytes);
  return segment;
}

size_t element_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: fail(ncclInvalidArgument, "data type ", str(type), " is not emulated (fp8)");
  }
}

template <typename T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclSum: case ncclAvg: return static_cast<T>(a + b);
    case ncclProd: return static_cast<T>(a * b);
    case ncclMin: return std::min(a, b);
    case ncclMax: return std::max(a, b);
    default: fail(ncclInvalidArgument, "reduction op ", str(op), " is not emulated");
  }
}

// acc[i] = acc[i] op x[i] for count elements of `type` (16-bit floats through f32); with
// `divisor`, then acc[i] /= divisor (an average's last step).
void reduce_into(std::byte* acc, const std::byte* x, size_t count, ncclDataType_t type,
                 ncclRedOp_t op, int divisor = 0) {
  auto each = [&](auto tag) {
    using T = decltype(tag);
    for (size_t i = 0; i < count; ++i) {
      T a, b;
      std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
      if (divisor > 0) {
        a = static_cast<T>(a / static_cast<T>(divisor));
      } else {
        std::memcpy(&b, x + i * sizeof(T), sizeof(T));
        a = combine(a, b, op);
      }
      std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
    }
  };
  auto each_16bit = [&](float (*widen)(uint16_t), uint16_t (*narrow)(float)) {
    for (size_t i = 0; i < count; ++i) {
      uint16_t a, b;
      std::memcpy(&a, acc + i * 2, 2);
      float result = widen(a);
      if (divisor > 0) {
        result /= static_cast<float>(divisor);
      } else {
        std::memcpy(&b, x + i * 2, 2);
        result = combine(result, widen(b), op);
      }
      a = narrow(result);
      std::memcpy(acc + i * 2, &a, 2);
    }
  };
  switch (type) {
    case ncclInt8: return each(int8_t{});
    case ncclUint8: return each(uint8_t{});
    case ncclInt32: return each(int32_t{});
    case ncclUint32: return each(uint32_t{});
    case ncclInt64: return each(int64_t{});
    case ncclUint64: return each(uint64_t{});
    case ncclFloat32: return each(float{});
    case ncclFloat64: return each(double{});
    case ncclFloat16: return each_16bit(f16_bits_to_float, float_to_f16_bits);
    case ncclBfloat16: return each_16bit(bf16_bits_to_float, float_to_bf16_bits);
    default: fail(ncclInvalidArgument, "data type ", str(type), " is not emulated (fp8)");
  }
}

}  // namespace
}  // namespace loom::cuda_emulation::nccl

namespace emu_nccl = loom::cuda_emulation::nccl;

// One rank's handle of a communicator (Note [Emulated NCCL]). Used by one thread at a time,
// as NCCL requires.
struct ncclComm {
  std::string name;
  int rank = 0, size = 0;
  emu_nccl::Mapping board_mapping;
  emu_nccl::Board* board = nullptr;
  bool blocking = true;
  bool all_joined = false;
  ncclResult_t state = ncclInProgress;  // what ncclCommGetAsyncError reports
  std::string last_error;
  uint64_t collectives = 0;               // issued by this rank
  std::vector<uint64_t> sends, receives;  // per peer, issued by this rank
  int splits = 0;
  ncclComm** split_slot = nullptr;  // a split's handle, filled by the poll that finds it done
  ncclComm* split_child = nullptr;
  bool finalizing = false;

  // A board keeps its name until every rank has joined (settle_joining unlinks it then); a
  // handle that goes before that (destroyed, aborted, or a split's child its parent never
  // delivered) unlinks it, so that nothing is left in /dev/shm.
  ~ncclComm() {
    if (!all_joined && !name.empty()) shm_unlink(name.c_str());
    delete split_child;
  }
};

namespace loom::cuda_emulation::nccl {
namespace {

std::string collective_segment(const ncclComm& comm, uint64_t number, int rank) {
  return comm.name + "." + str(static_cast<long long>(number)) + "." + str(rank);
}

std::string message_segment(const ncclComm& comm, int source, int destination, uint64_t number) {
  return comm.name + ".p" + str(source) + "-" + str(destination) + "." +
         str(static_cast<long long>(number));
}

// ncclRemoteError when a peer aborted the communicator or its process has exited.
void check_peers(const ncclComm& comm, const char* what) {
  const Board& board = *comm.board;
  if (const int by = board.aborted_by.load(std::memory_order_acquire); by > 0) {
    fail(ncclRemoteError, "rank ", str(by - 1), " aborted communicator ", comm.name, " while rank ",
         str(comm.rank), " waited in ", what);
  }
  for (int peer = 0; peer < comm.size; ++peer) {
    const pid_t pid = board.pids[peer].load(std::memory_order_acquire);
    if (peer != comm.rank && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      fail(ncclRemoteError, "rank ", str(peer), " (pid ", str(pid), ") of communicator ", comm.name,
           " exited while rank ", str(comm.rank), " waited in ", what);
    }
  }
}

// A wait inside a call: fails as check_peers does (every few hundred polls), or when it
// exceeded its limit; yields at first, then sleeps between polls.
class Watch {
 public:
  Watch(const ncclComm& comm, const char* what) : comm_(comm), what_(what) {}

  void check() {
    if (++polls_ % 256 == 0) {
      check_peers(comm_, what_);
      if (std::chrono::steady_clock::now() - start_ > wait_limit()) {
        fail(ncclRemoteError, "rank ", str(comm_.rank), " waited in ", what_, " for more than ",
             str(wait_limit().count()), " s (LOOM_EMULATED_NCCL_TIMEOUT_S) on communicator ",
             comm_.name);
      }
    }
    if (polls_ < 2048) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  template <typename Ready>
  void until(Ready&& ready) {
    while (!ready()) check();
  }

 private:
  const ncclComm& comm_;
  const char* what_;
  unsigned polls_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

bool every_rank_reached(const std::atomic<uint64_t>* marks, int size, uint64_t value) {
  for (int r = 0; r < size; ++r)
    if (marks[r].load(std::memory_order_acquire) < value) return false;
  return true;
}

// One collective (Note [Emulated NCCL]): publishes `bytes` of `mine`, then calls
// read(rank, data, bytes) for each rank of `from` with what that rank published.
void exchange(ncclComm& comm, const char* what, const void* mine, size_t bytes,
              const std::vector<int>& from,
              const std::function<void(int, const std::byte*, size_t)>& read) {
  Board& board = *comm.board;
  const uint64_t number = comm.collectives++;
  Mapping own = publish(collective_segment(comm, number, comm.rank), mine, bytes);
  own.unlink_when_closed();  // after every rank has left, or at once on a failure
  board.arrived[comm.rank].store(number + 1, std::memory_order_release);
  Watch watch(comm, what);
  watch.until([&] { return every_rank_reached(board.arrived, comm.size, number + 1); });
  for (int peer : from) {
    if (peer == comm.rank) {
      read(peer, own.data(), own.bytes());
    } else {
      Mapping theirs(collective_segment(comm, number, peer), 0, false);
      read(peer, theirs.data(), theirs.bytes());
    }
  }
  board.left[comm.rank].store(number + 1, std::memory_order_release);
  watch.until([&] { return every_rank_reached(board.left, comm.size, number + 1); });
}

std::vector<int> every_rank(const ncclComm& comm) {
  std::vector<int> ranks(static_cast<size_t>(comm.size));
  for (int r = 0; r < comm.size; ++r)
    ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

void expect_bytes(const char* what, int peer, size_t got, size_t want) {
  if (got != want) {
    fail(ncclInvalidUsage, what, ": rank ", str(peer), " contributed ",
         str(static_cast<long long>(got)), " bytes where ", str(static_cast<long long>(want)),
         " were expected (counts or types differ between ranks)");
  }
}

void check_peer(const ncclComm& comm, const char* what, int peer) {
  if (peer < 0 || peer >= comm.size) {
    fail(ncclInvalidArgument, what, ": rank ", str(peer), " is not in communicator ", comm.name,
         " of ", str(comm.size), " ranks");
  }
}

// Joins the board of `name` as rank `rank` of `size`.
ncclComm* join(std::string name, int size, int rank, const ncclConfig_t* config) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    fail(ncclInvalidArgument, "rank ", str(rank), " of ", str(size),
         ": the emulated NCCL runs 1 to ", str(kMaxRanks), " ranks");
  }
  auto comm = std::make_unique<ncclComm>();
  comm->name = std::move(name);
  comm->rank = rank;
  comm->size = size;
  comm->blocking = config == nullptr || config->blocking != 0;
  comm->board_mapping = Mapping(comm->name, sizeof(Board), true);
  comm->board = reinterpret_cast<Board*>(comm->board_mapping.data());
  comm->sends.assign(static_cast<size_t>(size), 0);
  comm->receives.assign(static_cast<size_t>(size), 0);
  comm->board->pids[rank].store(getpid(), std::memory_order_release);
  comm->board->joined.fetch_add(1, std::memory_order_acq_rel);
  return comm.release();
}

// Whether every rank has joined; the first to see it unlinks the board's name (each has it
// mapped by then).
bool settle_joining(ncclComm& comm) {
  if (!comm.all_joined && comm.board->joined.load(std::memory_order_acquire) == comm.size) {
    shm_unlink(comm.name.c_str());
    comm.all_joined = true;
  }
  return comm.all_joined;
}

bool messages_taken(const ncclComm& comm) {
  for (int peer = 0; peer < comm.size; ++peer)
    if (comm.board->taken[comm.rank][peer].load(std::memory_order_acquire) <
        comm.sends[static_cast<size_t>(peer)])
      return false;
  return true;
}

// Progress of whatever the communicator is in the middle of (joining, a split, finalising),
// without waiting: the caller polls again. The peers are checked only when something is still
// awaited from them: after a split's exchange a rank alone in its colour may finish and exit
// while this rank's poll has not yet seen the parent settled, and that is no failure.
void poll(ncclComm& comm) {
  if (comm.state != ncclInProgress) return;
  if (settle_joining(comm)) {
    if (comm.split_slot != nullptr) {
      *std::exchange(comm.split_slot, nullptr) = std::exchange(comm.split_child, nullptr);
    }
    if (!comm.finalizing || messages_taken(comm)) {
      comm.state = ncclSuccess;
      return;
    }
  }
  check_peers(comm, comm.finalizing ? "ncclCommFinalize" : "joining the communicator");
}

// Runs `body` as one call on `comm`: a failure is the call's result and stays on the
// communicator.
template <typename Body>
ncclResult_t call(ncclComm* comm, Body&& body) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->state != ncclSuccess && comm->state != ncclInProgress) return comm->state;
  try {
    return body();
  } catch (const Failure& failure) {
    comm->state = failure.result;
    comm->last_error = failure.message;
    return failure.result;
  }
}

// Polls until whatever the communicator is in the middle of has finished.
void settle(ncclComm& comm, const char* what) {
  Watch watch(comm, what);
  while (comm.state == ncclInProgress) {
    poll(comm);
    if (comm.state == ncclInProgress) watch.check();
  }
}

// Waits until a blocking communicator is ready; a non-blocking one reports its progress.
ncclResult_t after_issue(ncclComm& comm) {
  if (comm.blocking) {
    settle(comm, "joining");
  } else {
    poll(comm);
  }
  return comm.state;
}

// Work on `stream`: refused while the stream captures (Note [Emulated NCCL]), after the
// joining of a communicator made non-blocking.
void prepare(ncclComm& comm, cudaStream_t stream, const char* what) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    fail(ncclInvalidUsage, what, ": the emulated NCCL does not run inside a stream capture");
  }
  settle(comm, what);
}

// The calls of an open group on this thread (sends first at its end).
struct Deferred {
  bool is_send;
  std::function<ncclResult_t()> run;
};
thread_local int group_depth = 0;
thread_local std::vector<Deferred> group_calls;

// One operation `what` of `comm` on `stream`, reading `send` and writing `receive` (either may
// be null): body() runs now, or at the end of this thread's open group; a failure is the call's
// result and stays on the communicator. The live stream-order check sees it as device work on
// `stream` (Note [The stream-order check]).
template <typename Body>
ncclResult_t operation(ncclComm* comm, cudaStream_t stream, const char* what, bool is_send,
                       const void* send, void* receive, Body body) {
  auto run = [=] {
    return call(comm, [&] {
      prepare(*comm, stream, what);
      land_copies(stream);  // the stream's earlier copies come first
      note_device_work(what, {{send, true}, {receive, false}}, stream);
      body();
      return ncclSuccess;
    });
  };
  if (group_depth == 0) return run();
  group_calls.push_back({is_send, run});
  return ncclSuccess;
}

// Contributions reduced in rank order (Note [Emulated NCCL]): rank 0's copied, each later
// one's folded in with `op`, an average divided by the rank count at the end.
class RankOrderReduction {
 public:
  RankOrderReduction(size_t count, ncclDataType_t type, ncclRedOp_t op)
      : count_(count), type_(type), op_(op), value_(count * element_bytes(type)) {}
  size_t bytes() const { return value_.size(); }
  void add(int rank, const std::byte* data) {
    if (rank == 0) {
      std::memcpy(value_.data(), data, value_.size());
    } else {
      reduce_into(value_.data(), data, count_, type_, op_);
    }
  }
  void write(void* out, int ranks) {
    if (op_ == ncclAvg) reduce_into(value_.data(), nullptr, count_, type_, op_, ranks);
    std::memcpy(out, value_.data(), value_.size());
  }

 private:
  size_t count_;
  ncclDataType_t type_;
  ncclRedOp_t op_;
  std::vector<std::byte> value_;
};

}  // namespace
}  // namespace loom::cuda_emulation::nccl

using namespace loom::cuda_emulation::nccl;

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  std::random_device entropy;
  char name[NCCL_UNIQUE_ID_BYTES] = {};
  std::snprintf(name, sizeof name, "/loom-nccl-%d-%08x%08x", static_cast<int>(getpid()),
                entropy(), entropy());
  std::memcpy(id->internal, name, sizeof name);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (comm == nullptr) return ncclInvalidArgument;
  *comm = nullptr;
  id.internal[NCCL_UNIQUE_ID_BYTES - 1] = '\0';
  if (std::strncmp(id.internal, "/loom-nccl-", 11) != 0) return ncclInvalidArgument;
  try {
    *comm = join(id.internal, nranks, rank, config);
  } catch (const Failure& failure) {
    std::fprintf(stderr, "emulated NCCL: %s\n", failure.message.c_str());
    return failure.result;
  }
  return call(*comm, [&] { return after_issue(**comm); });
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  if (newcomm == nullptr) return ncclInvalidArgument;
  *newcomm = nullptr;
  return call(comm, [&] {
    prepare(*comm, nullptr, "ncclCommSplit");
    const int mine[2] = {color, key};
    std::vector<int> colors(static_cast<size_t>(comm->size)), keys(colors.size());
    exchange(*comm, "ncclCommSplit", mine, sizeof mine, every_rank(*comm),
             [&](int peer, const std::byte* data, size_t bytes) {
               expect_bytes("ncclCommSplit", peer, bytes, sizeof mine);
               std::memcpy(&colors[static_cast<size_t>(peer)], data, sizeof(int));
               std::memcpy(&keys[static_cast<size_t>(peer)], data + sizeof(int), sizeof(int));
             });
    const int number = comm->splits++;
    comm->split_slot = newcomm;
    comm->split_child = nullptr;
    comm->state = ncclInProgress;
    if (color != NCCL_SPLIT_NOCOLOR) {
      // The new ranks: the parent's ranks of this color, ordered by (key, parent rank).
      std::vector<int> members;
      for (int peer = 0; peer < comm->size; ++peer)
        if (colors[static_cast<size_t>(peer)] == color) members.push_back(peer);
      std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
        return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)];
      });
      const int new_rank = static_cast<int>(
          std::find(members.begin(), members.end(), comm->rank) - members.begin());
      comm->split_child = join(comm->name + ".s" + str(number) + "c" + str(color),
                               static_cast<int>(members.size()), new_rank, config);
    }
    if (!comm->blocking) return ncclSuccess;
    ncclComm* child = comm->split_child;
    after_issue(*comm);
    return child != nullptr ? after_issue(*child) : ncclSuccess;
  });
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  if (comm == nullptr || state == nullptr) return ncclInvalidArgument;
  try {
    poll(*comm);
  } catch (const Failure& failure) {
    comm->state = failure.result;
    comm->last_error = failure.message;
  }
  *state = comm->state;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (comm == nullptr || count == nullptr) return ncclInvalidArgument;
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr || rank == nullptr) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

// Finalising waits until this rank's messages are taken (a peer may still be receiving).
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return call(comm, [&] {
    comm->finalizing = true;
    comm->state = ncclInProgress;
    return after_issue(*comm);
  });
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete comm;
  return ncclSuccess;
}

// Peers waiting on this communicator fail rather than wait; this rank's untaken messages go.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->board->aborted_by.store(comm->rank + 1, std::memory_order_release);
  for (int peer = 0; peer < comm->size; ++peer) {
    const uint64_t posted = comm->sends[static_cast<size_t>(peer)];
    for (uint64_t m = comm->board->taken[comm->rank][peer].load(); m < posted; ++m)
      shm_unlink(message_segment(*comm, comm->rank, peer, m).c_str());
  }
  delete comm;  // with its board's name if not every rank joined, and an undelivered split
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  return comm != nullptr ? comm->last_error.c_str() : "";
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return ncclInvalidUsage;
  if (--group_depth > 0) return ncclSuccess;
  std::vector<Deferred> calls = std::exchange(group_calls, {});
  std::stable_partition(calls.begin(), calls.end(), [](const Deferred& c) { return c.is_send; });
  ncclResult_t result = ncclSuccess;
  for (Deferred& deferred : calls) {
    const ncclResult_t one = deferred.run();
    if (result == ncclSuccess) result = one;
  }
  return result;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return operation(comm, stream, "ncclAllReduce", false, sendbuff, recvbuff, [=] {
    RankOrderReduction sum(count, datatype, op);
    exchange(*comm, "ncclAllReduce", sendbuff, sum.bytes(), every_rank(*comm),
             [&](int peer, const std::byte* data, size_t got) {
               expect_bytes("ncclAllReduce", peer, got, sum.bytes());
               sum.add(peer, data);
             });
    sum.write(recvbuff, comm->size);
  });
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  return operation(comm, stream, "ncclReduce", false, sendbuff, recvbuff, [=] {
    check_peer(*comm, "ncclReduce", root);
    RankOrderReduction sum(count, datatype, op);
    const bool is_root = comm->rank == root;
    exchange(*comm, "ncclReduce", sendbuff, sum.bytes(),
             is_root ? every_rank(*comm) : std::vector<int>{},
             [&](int peer, const std::byte* data, size_t got) {
               expect_bytes("ncclReduce", peer, got, sum.bytes());
               sum.add(peer, data);
             });
    if (is_root) sum.write(recvbuff, comm->size);
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream) {
  return operation(comm, stream, "ncclBroadcast", false, sendbuff, recvbuff, [=] {
    check_peer(*comm, "ncclBroadcast", root);
    const size_t bytes = count * element_bytes(datatype);
    exchange(*comm, "ncclBroadcast", sendbuff, comm->rank == root ? bytes : 0, {root},
             [&](int peer, const std::byte* data, size_t got) {
               expect_bytes("ncclBroadcast", peer, got, bytes);
               std::memcpy(recvbuff, data, bytes);
             });
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return operation(comm, stream, "ncclAllGather", false, sendbuff, recvbuff, [=] {
    const size_t bytes = sendcount * element_bytes(datatype);
    exchange(*comm, "ncclAllGather", sendbuff, bytes, every_rank(*comm),
             [&](int peer, const std::byte* data, size_t got) {
               expect_bytes("ncclAllGather", peer, got, bytes);
               std::memcpy(static_cast<std::byte*>(recvbuff) + static_cast<size_t>(peer) * bytes,
                           data, bytes);
             });
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return operation(comm, stream, "ncclReduceScatter", false, sendbuff, recvbuff, [=] {
    RankOrderReduction sum(recvcount, datatype, op);
    const size_t bytes = sum.bytes() * static_cast<size_t>(comm->size);
    const size_t mine = sum.bytes() * static_cast<size_t>(comm->rank);
    exchange(*comm, "ncclReduceScatter", sendbuff, bytes, every_rank(*comm),
             [&](int peer, const std::byte* data, size_t got) {
               expect_bytes("ncclReduceScatter", peer, got, bytes);
               sum.add(peer, data + mine);
             });
    sum.write(recvbuff, comm->size);
  });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return operation(comm, stream, "ncclSend", true, sendbuff, nullptr, [=] {
    check_peer(*comm, "ncclSend", peer);
    const uint64_t number = comm->sends[static_cast<size_t>(peer)]++;
    publish(message_segment(*comm, comm->rank, peer, number), sendbuff,
            count * element_bytes(datatype));
    comm->board->sent[comm->rank][peer].store(number + 1, std::memory_order_release);
  });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return operation(comm, stream, "ncclRecv", false, nullptr, recvbuff, [=] {
    check_peer(*comm, "ncclRecv", peer);
    const uint64_t number = comm->receives[static_cast<size_t>(peer)]++;
    Board& board = *comm->board;
    Watch(*comm, "ncclRecv").until([&] {
      return board.sent[peer][comm->rank].load(std::memory_order_acquire) > number;
    });
    Mapping message(message_segment(*comm, peer, comm->rank, number), 0, false);
    message.unlink_when_closed();  // read once, by its one receiver
    expect_bytes("ncclRecv", peer, message.bytes(), count * element_bytes(datatype));
    if (message.bytes() > 0) std::memcpy(recvbuff, message.data(), message.bytes());
    board.taken[peer][comm->rank].store(number + 1, std::memory_order_release);
  });
}

}  // extern "C"
