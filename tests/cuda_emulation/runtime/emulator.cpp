#include "emulator.h"

#include "fiber_context.h"
#include "stream_capture.h"
#include "work_log.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

// AddressSanitizer: GCC defines __SANITIZE_ADDRESS__, clang answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define LOOM_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LOOM_EMULATION_ASAN 1
#endif
#endif
#ifdef LOOM_EMULATION_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define LOOM_EMULATION_ASAN 0
#endif

// Note [Kernel emulation]
// ~~~~~~~~~~~~~~~~~~~~~~~
// Fibers rather than one host thread per CUDA thread: a block of 1024 threads would be 1024
// OS threads, each barrier a thousand context switches through the kernel, on a 2-core
// machine. Fibers switch in user space, run deterministically for a given Schedule, and let
// the scheduler know exactly who waits where, which is what turns a barrier that can never
// complete into an error naming it instead of a hang.
//
// A barrier is a count: __syncthreads releases when every thread of the block has arrived
// or exited (as on sm_70 and later, where exited threads no longer hold a barrier); a warp
// operation releases when every lane of its mask has arrived, and a lane of the mask that
// has exited is an error, since CUDA leaves that undefined. The last thread to arrive
// releases the others and then waits for the scheduler like them, so the next phase starts
// in the Schedule's order, not with whoever happened to arrive last.

namespace loom::cuda_emulation {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
#if LOOM_EMULATION_ASAN
constexpr size_t kStackBytes = 1024 * 1024;  // ASan's redzones grow every frame
#else
constexpr size_t kStackBytes = 256 * 1024;
#endif

enum class Wait { kRunnable, kBlockBarrier, kWarpBarrier, kExited };

struct Fiber {
  FiberContext context;
  unsigned char* stack = nullptr;  // usable stack, above a guard page
  ThreadIds ids{};
  int index = 0;  // linear thread index in the block
  Wait wait = Wait::kRunnable;
#if LOOM_EMULATION_ASAN
  void* fake_stack = nullptr;
#endif
  alignas(16) unsigned char shuffle_in[16] = {};
  alignas(16) unsigned char shuffle_out[16] = {};
  alignas(16) unsigned char registers_in[64] = {};  // warp_register_operation
  alignas(16) unsigned char registers_out[64] = {};
  // cp.async: queued copies, oldest first, and the number of them each committed group ends at.
  struct AsyncCopy {
    void* dst;
    const void* src;
    size_t bytes, src_bytes;
  };
  std::vector<AsyncCopy> async_copies;
  std::vector<size_t> async_group_ends;
};

void make_async_copies(Fiber& f, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const Fiber::AsyncCopy& c = f.async_copies[i];
    std::memcpy(c.dst, c.src, c.src_bytes);
    std::memset(static_cast<unsigned char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
  }
  f.async_copies.erase(f.async_copies.begin(), f.async_copies.begin() + static_cast<long>(count));
  for (size_t& end : f.async_group_ends)
    end -= std::min(end, count);
}

// A warp operation in progress: which lanes it names and which have arrived.
struct WarpBarrier {
  const char* operation = nullptr;  // nullptr: none in progress
  unsigned mask = 0;
  unsigned arrived = 0;
  size_t bytes = 0;
  int lane_mask = 0;
  int width = kWarpSize;
  unsigned char arguments[32] = {};  // what every lane must pass alike (WMMA pointers, ldm)
  size_t argument_bytes = 0;
};

// Per warp, beyond its barrier: whether the first lane to go on after a warp collective has
// yet to run, and a buffer that lane can fill for the others (warp_scratch).
struct WarpShared {
  bool leader_pending = false;
  std::vector<unsigned char> scratch;
};

// Stacks for the threads of a block, made once and reused (with a guard page below each, so
// that an overflow faults instead of corrupting a neighbour).
class StackPool {
 public:
  ~StackPool() {
    for (unsigned char* base : bases_) munmap(base, kStackBytes + page());
  }
  unsigned char* stack(size_t i) {
    while (bases_.size() <= i) {
      void* base = mmap(nullptr, kStackBytes + page(), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (base == MAP_FAILED) throw std::bad_alloc();
      mprotect(base, page(), PROT_NONE);
      bases_.push_back(static_cast<unsigned char*>(base));
    }
    return bases_[i] + page();
  }

#if LOOM_EMULATION_ASAN
  // A thread that exits leaves its stack's shadow clean (each frame unpoisons itself on
  // return; a throw unpoisons the whole fiber stack); one whose block was stopped by a trap
  // or an error leaves its live frames' redzones poisoned. Only those stacks are unpoisoned
  // before reuse: unpoisoning every 1 MiB stack for every block made the emulation tests 30
  // to 130 times slower under ASan than in the release build.
  void begin_thread(size_t i) {
    if (unfinished_.size() <= i) unfinished_.resize(i + 1, false);
    if (unfinished_[i]) __asan_unpoison_memory_region(stack(i), kStackBytes);
    unfinished_[i] = true;
  }
  void end_thread(size_t i) { unfinished_[i] = false; }
#endif

 private:
  static size_t page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
  std::vector<unsigned char*> bases_;
#if LOOM_EMULATION_ASAN
  std::vector<bool> unfinished_;
#endif
};

// One launch's state. Launches are serialised (launch_mutex), so one exists at a time.
struct Run {
  LaunchConfig config{};
  const std::function<void()>* body = nullptr;
  std::vector<Fiber> fibers;
  std::vector<WarpBarrier> warps;
  std::vector<WarpShared> warp_shared;
  int threads = 0;
  int at_block_barrier = 0;
  int exited = 0;
  Fiber* current = nullptr;
  void* dynamic_shared = nullptr;
  std::vector<const void*> shared_in_use;  // static __shared__ arrays poisoned in this block
  std::exception_ptr error;  // an EmulationError or a kernel's own exception
  bool trapped = false;
  FiberContext scheduler;
#if LOOM_EMULATION_ASAN
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_size = 0;
#endif
};

std::mutex launch_mutex;
Run* active = nullptr;
StackPool stacks;
Schedule schedule_setting;
cudaError_t sticky_error = cudaSuccess;

Run& run() {
  if (active == nullptr)
    throw EmulationError("a CUDA device built-in was called outside an emulated kernel launch");
  return *active;
}

std::string block_name(const Run& r) {
  const auto& b = r.fibers.front().ids.block_idx;
  std::ostringstream out;
  out << "block (" << b.x << "," << b.y << "," << b.z << ")";
  return out.str();
}

std::string thread_name(const Fiber& f) {
  std::ostringstream out;
  out << "thread (" << f.ids.thread_idx.x << "," << f.ids.thread_idx.y << ","
      << f.ids.thread_idx.z << ") [warp " << f.index / kWarpSize << " lane "
      << f.index % kWarpSize << "]";
  return out.str();
}

std::string hex(unsigned v) {
  std::ostringstream out;
  out << "0x" << std::hex << v;
  return out.str();
}

// Thrown through a trapping thread's stack to its fiber's entry.
struct Trapped {};

[[noreturn]] void undefined(const Run& r, const Fiber& f, const std::string& what) {
  throw EmulationError("[cuda emulation] " + block_name(r) + ", " + thread_name(f) + ": " + what);
}

// ---- Fiber switching -----------------------------------------------------------------------

void switch_to_scheduler(Run& r, Fiber& self, bool exiting) {
#if LOOM_EMULATION_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &self.fake_stack, r.scheduler_stack,
                                 r.scheduler_stack_size);
#else
  (void)exiting;
#endif
  switch_context(self.context, r.scheduler);
#if LOOM_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(self.fake_stack, nullptr, nullptr);
#endif
}

void switch_to_fiber(Run& r, Fiber& f) {
  r.current = &f;
#if LOOM_EMULATION_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kStackBytes);
#endif
  switch_context(r.scheduler, f.context);
#if LOOM_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  r.current = nullptr;
}

void release_block_barrier(Run& r) {
  for (Fiber& f : r.fibers)
    if (f.wait == Wait::kBlockBarrier) f.wait = Wait::kRunnable;
  r.at_block_barrier = 0;
}

bool block_barrier_complete(const Run& r) {
  return r.at_block_barrier > 0 && r.at_block_barrier + r.exited == r.threads;
}

unsigned lanes_of_warp(const Run& r, int warp) {
  const int lanes = std::min(kWarpSize, r.threads - warp * kWarpSize);
  return lanes == kWarpSize ? kFullMask : (1u << lanes) - 1u;
}

[[noreturn]] void fiber_main() {
  Run& r = *active;
  Fiber& self = *r.current;
#if LOOM_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &r.scheduler_stack, &r.scheduler_stack_size);
#endif
  try {
    (*r.body)();
  } catch (const Trapped&) {
    // r.trapped is set; the launch stops after this block
  } catch (...) {
    if (!r.error) r.error = std::current_exception();
  }
  make_async_copies(self, self.async_copies.size());
  self.async_group_ends.clear();
  self.wait = Wait::kExited;
  ++r.exited;
  const int warp = self.index / kWarpSize, lane = self.index % kWarpSize;
  const WarpBarrier& wb = r.warps[static_cast<size_t>(warp)];
  if (!r.error && wb.operation != nullptr && (wb.mask >> lane & 1u) != 0) {
    try {
      undefined(r, self, std::string("exited while its warp waits for it in ") + wb.operation +
                             " with mask " + hex(wb.mask));
    } catch (...) {
      r.error = std::current_exception();
    }
  }
  if (block_barrier_complete(r)) release_block_barrier(r);
#if LOOM_EMULATION_ASAN
  stacks.end_thread(static_cast<size_t>(self.index));
#endif
  switch_to_scheduler(r, self, /*exiting=*/true);
  std::abort();  // an exited fiber is never resumed
}

// ---- The scheduler -------------------------------------------------------------------------

std::string deadlock_report(const Run& r) {
  std::ostringstream out;
  out << "[cuda emulation] " << block_name(r) << " can never finish: " << r.at_block_barrier
      << " of " << r.threads << " threads wait at __syncthreads, " << r.exited << " exited";
  for (size_t w = 0; w < r.warps.size(); ++w) {
    const WarpBarrier& wb = r.warps[w];
    if (wb.operation != nullptr) {
      out << "; warp " << w << " waits in " << wb.operation << " (mask " << hex(wb.mask)
          << ", arrived " << hex(wb.arrived) << ")";
    }
  }
  out << " (a barrier in divergent code, or one that not every thread reaches)";
  return out.str();
}

std::vector<int> pass_order(int threads, std::mt19937_64& rng) {
  std::vector<int> order(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) order[static_cast<size_t>(i)] = i;
  switch (schedule_setting.order) {
    case Order::kForward: break;
    case Order::kReverse: std::reverse(order.begin(), order.end()); break;
    case Order::kShuffled: std::shuffle(order.begin(), order.end(), rng); break;
    case Order::kWarpsReverse: break;  // see run_pass
  }
  return order;
}

// Runs thread i if it can; false when it cannot. Stops the block on an error or a trap.
bool step(Run& r, int i) {
  Fiber& f = r.fibers[static_cast<size_t>(i)];
  if (f.wait != Wait::kRunnable) return false;
  switch_to_fiber(r, f);
  if (r.error) std::rethrow_exception(r.error);
  return true;
}

// One pass of the scheduler; false when no thread could run. Lockstep orders run every
// runnable thread once, to its next barrier of any kind, so warps keep pace with each other.
// kWarpsReverse runs the last warp until none of its threads can go on (all at __syncthreads
// or exited), then the one before, and so on: warps drift apart across their warp-level
// operations, as they may on a GPU, which shows a missing __syncthreads that lockstep hides.
bool run_pass(Run& r, std::mt19937_64& rng) {
  bool ran = false;
  if (schedule_setting.order == Order::kWarpsReverse) {
    for (int warp = static_cast<int>(r.warps.size()) - 1; warp >= 0; --warp) {
      const int first = warp * kWarpSize, last = std::min(r.threads, first + kWarpSize);
      for (bool warp_ran = true; warp_ran && !r.trapped;) {
        warp_ran = false;
        for (int i = first; i < last && !r.trapped; ++i) warp_ran |= step(r, i);
        ran |= warp_ran;
      }
    }
    return ran;
  }
  for (int i : pass_order(r.threads, rng)) {
    ran |= step(r, i);
    if (r.trapped) break;
  }
  return ran;
}

void poison_shared_memory(Run& r) {
  r.shared_in_use.clear();  // static arrays: when a thread of this block first reaches them
  if (r.dynamic_shared != nullptr) std::memset(r.dynamic_shared, 0xFF, r.config.shared_bytes);
}

void run_block(Run& r, const uint3& block_idx, std::mt19937_64& rng) {
  const dim3 bd = r.config.block;
  poison_shared_memory(r);
  r.at_block_barrier = 0;
  r.exited = 0;
  std::fill(r.warps.begin(), r.warps.end(), WarpBarrier{});
  for (WarpShared& w : r.warp_shared) w.leader_pending = false;
  for (int i = 0; i < r.threads; ++i) {
    Fiber& f = r.fibers[static_cast<size_t>(i)];
    f.index = i;
    f.wait = Wait::kRunnable;
    f.async_copies.clear();
    f.async_group_ends.clear();
    f.ids.thread_idx = uint3{static_cast<unsigned>(i) % bd.x,
                             static_cast<unsigned>(i) / bd.x % bd.y,
                             static_cast<unsigned>(i) / (bd.x * bd.y)};
    f.ids.block_idx = block_idx;
    f.ids.block_dim = bd;
    f.ids.grid_dim = r.config.grid;
    f.stack = stacks.stack(static_cast<size_t>(i));
#if LOOM_EMULATION_ASAN
    stacks.begin_thread(static_cast<size_t>(i));
    f.fake_stack = nullptr;
#endif
    make_context(f.context, f.stack, kStackBytes, fiber_main);
  }
  while (r.exited < r.threads) {
    const bool ran = run_pass(r, rng);
    if (r.trapped) return;
    if (!ran) throw EmulationError(deadlock_report(r));
  }
}

// Whether a device would refuse the launch's configuration (cudaErrorInvalidConfiguration):
// a zero dimension, more than 1024 threads per block, or a dimension past its limit.
bool refused_configuration(const LaunchConfig& c) {
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  return c.block.x == 0 || c.block.y == 0 || c.block.z == 0 || c.grid.x == 0 || c.grid.y == 0 ||
         c.grid.z == 0 || c.block.x > 1024 || c.block.y > 1024 || c.block.z > 64 ||
         threads > 1024 || c.grid.x > 0x7fffffffu || c.grid.y > 65535 || c.grid.z > 65535;
}

}  // namespace

// Set by the emulated runtime API (cuda_runtime_api.cpp).
cudaError_t emulated_last_error = cudaSuccess;
size_t max_dynamic_shared_bytes(const void* kernel);

void set_schedule(const Schedule& schedule) { schedule_setting = schedule; }

std::string describe(const Schedule& schedule) {
  switch (schedule.order) {
    case Order::kForward: return "forward";
    case Order::kReverse: return "reverse";
    case Order::kShuffled: return "shuffled(" + std::to_string(schedule.seed) + ")";
    case Order::kWarpsReverse: return "warps-reverse";
  }
  return "?";
}

const ThreadIds& this_thread() {
  Run& r = run();
  return r.current->ids;
}

cudaError_t device_error() { return sticky_error; }
void clear_device_error() {
  sticky_error = cudaSuccess;
  emulated_last_error = cudaSuccess;
}

void sync_threads() {
  Run& r = run();
  Fiber& self = *r.current;
  self.wait = Wait::kBlockBarrier;
  ++r.at_block_barrier;
  if (block_barrier_complete(r)) release_block_barrier(r);
  switch_to_scheduler(r, self, false);
}

namespace {

// Arrival at a warp operation; returns once every lane of `mask` has arrived. `on_release`
// runs once, in the last lane to arrive, before any lane goes on.
void warp_barrier(const char* operation, unsigned mask, size_t bytes, int lane_mask, int width,
                  void (*on_release)(Run&, int warp), const void* arguments = nullptr,
                  size_t argument_bytes = 0) {
  Run& r = run();
  Fiber& self = *r.current;
  const int warp = self.index / kWarpSize, lane = self.index % kWarpSize;
  const unsigned existing = lanes_of_warp(r, warp);
  if ((mask >> lane & 1u) == 0)
    undefined(r, self, std::string(operation) + " with mask " + hex(mask) + " that omits the calling lane");
  if ((mask & ~existing) != 0) {
    undefined(r, self, std::string(operation) + " with mask " + hex(mask) + " names lanes " +
                           hex(mask & ~existing) + " that do not exist (the warp has lanes " +
                           hex(existing) + ")");
  }
  WarpBarrier& wb = r.warps[static_cast<size_t>(warp)];
  if (wb.operation == nullptr) {
    // Lanes that exit later, while the barrier waits, are caught as they exit (fiber_main);
    // a later lane's mask must be this one.
    for (int l = 0; l < kWarpSize; ++l) {
      if ((mask >> l & 1u) != 0 &&
          r.fibers[static_cast<size_t>(warp * kWarpSize + l)].wait == Wait::kExited) {
        undefined(r, self, std::string(operation) + " with mask " + hex(mask) + " names lane " +
                               std::to_string(l) + ", which has exited");
      }
    }
    wb = WarpBarrier{operation, mask, 0, bytes, lane_mask, width, {}, argument_bytes};
    if (argument_bytes > 0) std::memcpy(wb.arguments, arguments, argument_bytes);
  } else if (argument_bytes > 0 && std::memcmp(wb.arguments, arguments, argument_bytes) != 0) {
    undefined(r, self, std::string(operation) + " with other arguments than the lanes of its warp "
                           "that reached it first (CUDA requires the same pointer and stride "
                           "in every lane)");
  } else if ((wb.operation != operation && std::strcmp(wb.operation, operation) != 0) ||
             wb.mask != mask || wb.bytes != bytes ||
             wb.lane_mask != lane_mask || wb.width != width) {
    undefined(r, self, std::string("reached ") + operation + " (mask " + hex(mask) +
                           ") while other lanes of its warp wait in " + wb.operation + " (mask " +
                           hex(wb.mask) + "): the warp diverged at a warp-synchronous operation");
  }
  wb.arrived |= 1u << lane;
  self.wait = Wait::kWarpBarrier;
  if (wb.arrived == wb.mask) {
    if (on_release != nullptr) on_release(r, warp);
    r.warp_shared[static_cast<size_t>(warp)].leader_pending = true;
    for (int l = 0; l < kWarpSize; ++l) {
      if ((wb.mask >> l & 1u) != 0) r.fibers[static_cast<size_t>(warp * kWarpSize + l)].wait = Wait::kRunnable;
    }
    wb = WarpBarrier{};
  }
  switch_to_scheduler(r, self, false);
}

void exchange_shuffled_values(Run& r, int warp) {
  const WarpBarrier& wb = r.warps[static_cast<size_t>(warp)];
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if ((wb.mask >> lane & 1u) == 0) continue;
    int source = lane ^ wb.lane_mask;
    if (source / wb.width > lane / wb.width) source = lane;  // a later group: own value
    Fiber& dst = r.fibers[static_cast<size_t>(warp * kWarpSize + lane)];
    if (source >= kWarpSize || (wb.mask >> source & 1u) == 0) {
      undefined(r, dst, "__shfl_xor_sync reads lane " + std::to_string(source) +
                            ", which is not in the mask " + hex(wb.mask) + " (its value is undefined)");
    }
    const Fiber& src = r.fibers[static_cast<size_t>(warp * kWarpSize + source)];
    std::memcpy(dst.shuffle_out, src.shuffle_in, wb.bytes);
  }
}

// __all_sync: each lane of the mask gets 1 when every lane of the mask passed a nonzero
// predicate (in its shuffle_in), else 0.
void vote_all_lanes(Run& r, int warp) {
  const WarpBarrier& wb = r.warps[static_cast<size_t>(warp)];
  int all = 1;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if ((wb.mask >> lane & 1u) == 0) continue;
    int predicate;
    std::memcpy(&predicate, r.fibers[static_cast<size_t>(warp * kWarpSize + lane)].shuffle_in,
                sizeof(predicate));
    all &= predicate != 0 ? 1 : 0;
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if ((wb.mask >> lane & 1u) != 0)
      std::memcpy(r.fibers[static_cast<size_t>(warp * kWarpSize + lane)].shuffle_out, &all,
                  sizeof(all));
  }
}

}  // namespace

void sync_warp(unsigned mask) { warp_barrier("__syncwarp", mask, 0, 0, kWarpSize, nullptr); }

unsigned active_mask() {
  // Lanes that have not exited: the emulator cannot know which lanes took the caller's
  // branch, so this is the widest answer CUDA could give.
  Run& r = run();
  const int warp = r.current->index / kWarpSize;
  unsigned mask = 0;
  for (int l = 0; l < kWarpSize; ++l) {
    const int i = warp * kWarpSize + l;
    if (i < r.threads && r.fibers[static_cast<size_t>(i)].wait != Wait::kExited) mask |= 1u << l;
  }
  return mask;
}

void shuffle_xor(unsigned mask, void* value, size_t bytes, int lane_mask, int width) {
  Run& r = run();
  if (bytes > sizeof(Fiber::shuffle_in))
    undefined(r, *r.current, "__shfl_xor_sync of a value wider than 16 bytes");
  if (width <= 0 || width > kWarpSize || (width & (width - 1)) != 0)
    undefined(r, *r.current, "__shfl_xor_sync with width " + std::to_string(width) + " (expected a power of 2 up to 32)");
  std::memcpy(r.current->shuffle_in, value, bytes);
  warp_barrier("__shfl_xor_sync", mask, bytes, lane_mask, width, exchange_shuffled_values);
  std::memcpy(value, active->current->shuffle_out, bytes);
}

int vote_all(unsigned mask, int predicate) {
  Run& r = run();
  std::memcpy(r.current->shuffle_in, &predicate, sizeof(predicate));
  warp_barrier("__all_sync", mask, sizeof(predicate), 0, kWarpSize, vote_all_lanes);
  int all;
  std::memcpy(&all, active->current->shuffle_out, sizeof(all));
  return all;
}

bool warp_collective(const char* operation, const void* arguments, size_t bytes) {
  if (bytes > sizeof(WarpBarrier::arguments))
    throw EmulationError("[cuda emulation] warp_collective: more than 32 bytes of arguments");
  warp_barrier(operation, kFullMask, 0, 0, kWarpSize, nullptr, arguments, bytes);
  Run& r = *active;
  WarpShared& w = r.warp_shared[static_cast<size_t>(r.current->index / kWarpSize)];
  return std::exchange(w.leader_pending, false);
}

void warp_register_operation(const char* operation, const void* in, size_t in_bytes, void* out,
                             size_t out_bytes, WarpRegisterCompute compute) {
  Run& r = run();
  if (in_bytes > sizeof(Fiber::registers_in) || out_bytes > sizeof(Fiber::registers_out))
    undefined(r, *r.current, std::string(operation) + ": more than 64 bytes of registers per lane");
  std::memcpy(r.current->registers_in, in, in_bytes);
  // The same computation in every lane: its address is the argument all lanes pass alike.
  if (warp_collective(operation, &compute, sizeof(compute))) {
    Run& now = *active;
    const int first = now.current->index / kWarpSize * kWarpSize;
    unsigned char ins[kWarpSize * 64], outs[kWarpSize * 64];
    for (int l = 0; l < kWarpSize; ++l)
      std::memcpy(ins + l * in_bytes, now.fibers[static_cast<size_t>(first + l)].registers_in,
                  in_bytes);
    compute(ins, outs);
    for (int l = 0; l < kWarpSize; ++l)
      std::memcpy(now.fibers[static_cast<size_t>(first + l)].registers_out, outs + l * out_bytes,
                  out_bytes);
  }
  std::memcpy(out, active->current->registers_out, out_bytes);
}

void async_copy(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  Run& r = run();
  if (src_bytes > bytes)
    undefined(r, *r.current, "cp.async with a source size above its copy size");
  r.current->async_copies.push_back({dst, src, bytes, src_bytes});
}

void async_commit() {
  Fiber& f = *run().current;
  f.async_group_ends.push_back(f.async_copies.size());
}

void async_wait(int newest_pending) {
  Fiber& f = *run().current;
  const size_t groups = f.async_group_ends.size();
  const size_t done = groups > static_cast<size_t>(newest_pending)
                          ? groups - static_cast<size_t>(newest_pending)
                          : 0;
  if (done == 0) return;
  const size_t copies = f.async_group_ends[done - 1];
  f.async_group_ends.erase(f.async_group_ends.begin(),
                           f.async_group_ends.begin() + static_cast<long>(done));
  make_async_copies(f, copies);
}

void* warp_scratch(size_t bytes) {
  Run& r = run();
  std::vector<unsigned char>& scratch =
      r.warp_shared[static_cast<size_t>(r.current->index / kWarpSize)].scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  return scratch.data();
}

void* dynamic_shared_memory() {
  Run& r = run();
  if (r.dynamic_shared == nullptr)
    undefined(r, *r.current, "extern __shared__ memory used by a launch that asked for 0 bytes of it");
  return r.dynamic_shared;
}

void shared_memory_in_use(void* array, size_t bytes) {
  Run& r = run();
  if (std::find(r.shared_in_use.begin(), r.shared_in_use.end(), array) != r.shared_in_use.end())
    return;
  std::memset(array, 0xFF, bytes);
  r.shared_in_use.push_back(array);
}

void trap() {
  Run& r = run();
  r.trapped = true;
  throw Trapped{};
}

namespace {

// Runs every block of the grid (the launch was checked when issued).
void execute_grid(const LaunchConfig& config, const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(launch_mutex);
  if (sticky_error != cudaSuccess) return;  // a trapped kernel ends the context's work
  Run r;
  r.config = config;
  r.body = &body;
  r.threads = static_cast<int>(config.block.x * config.block.y * config.block.z);
  r.fibers.resize(static_cast<size_t>(r.threads));
  r.warps.resize(static_cast<size_t>((r.threads + kWarpSize - 1) / kWarpSize));
  r.warp_shared.resize(r.warps.size());
  struct SharedBuffer {
    void* p = nullptr;
    ~SharedBuffer() { ::operator delete(p, std::align_val_t{128}); }
  } shared;
  if (config.shared_bytes > 0) {
    shared.p = ::operator new(config.shared_bytes, std::align_val_t{128});
    r.dynamic_shared = shared.p;
  }
  std::mt19937_64 rng(schedule_setting.seed);
  active = &r;
  struct Deactivate {
    ~Deactivate() { active = nullptr; }
  } deactivate;
  std::vector<uint3> blocks;
  for (unsigned z = 0; z < config.grid.z; ++z)
    for (unsigned y = 0; y < config.grid.y; ++y)
      for (unsigned x = 0; x < config.grid.x; ++x) blocks.push_back(uint3{x, y, z});
  if (schedule_setting.order == Order::kReverse || schedule_setting.order == Order::kWarpsReverse)
    std::reverse(blocks.begin(), blocks.end());
  if (schedule_setting.order == Order::kShuffled) std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const uint3& b : blocks) {
    run_block(r, b, rng);
    if (r.trapped) {
      sticky_error = cudaErrorLaunchFailure;
      emulated_last_error = sticky_error;
      return;
    }
  }
}

}  // namespace

void run_grid(const LaunchConfig& config, std::function<void()> body) {
  {
    std::lock_guard<std::mutex> lock(launch_mutex);
    if (sticky_error != cudaSuccess) {
      emulated_last_error = sticky_error;
      return;
    }
    if (refused_configuration(config)) {
      emulated_last_error = cudaErrorInvalidConfiguration;
      return;
    }
    if (config.shared_bytes > max_dynamic_shared_bytes(config.kernel)) {
      emulated_last_error = cudaErrorInvalidValue;  // what a device says past the opt-in limit
      return;
    }
  }
  const cudaError_t refused =
      submit(config.stream, WorkKind::kKernel, config.name,
             [config, body = std::move(body)] { execute_grid(config, body); },
             config.argument_words);
  if (refused != cudaSuccess) emulated_last_error = refused;
}

}  // namespace loom::cuda_emulation
