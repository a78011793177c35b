#pragma once
// The CUDA execution model on the CPU, so that Loom's kernels run, unchanged, where there is
// no GPU (Note [Kernel emulation]).
//
// A launch runs its blocks one after another on the calling host thread. Every CUDA thread
// of a block is a fiber with its own stack; a fiber runs until it reaches a barrier
// (__syncthreads, __syncwarp, a warp shuffle, a WMMA operation) or returns, and the
// scheduler then runs the next. A barrier releases its waiters once every thread it names
// has arrived, so a kernel sees exactly the ordering guarantees CUDA gives and no more:
// - between barriers, the threads of a block run in the order the Schedule picks (forward,
//   reverse, shuffled afresh at every barrier, or warp by warp from the last), so a read
//   that needs a barrier it lacks sees the other order under one of them;
// - shared memory (static __shared__ arrays and the dynamic buffer) is filled with 0xFF
//   bytes, a NaN in every floating type, before each block, so a read before any write
//   poisons the result instead of finding an earlier block's values;
// - what CUDA leaves undefined is an error here (EmulationError, naming block, thread and
//   operation): a warp operation whose mask names a lane that has exited or does not exist,
//   lanes of one warp in different warp operations, a shuffle from a lane outside the mask,
//   a WMMA pointer that is not 32-byte aligned, and a barrier that can never be released.
//
// What it cannot establish: the hardware memory model (a thread's writes are visible at
// once, not at the next fence), device math (expf, tanhf, fused multiply-adds and the tensor
// cores' rounding are the host's), and anything about speed. One launch runs at a time.

#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "work_log.h"

namespace loom::cuda_emulation {

// Something a kernel did that CUDA leaves undefined, or a barrier that can never complete.
class EmulationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The order in which the runnable threads of a block run between two barriers. The first
// three keep warps in lockstep (each thread runs to its next barrier of any kind, then the
// next thread); kWarpsReverse runs each warp, last first, until all its threads wait at
// __syncthreads or exited, so warps drift apart across warp-level operations.
enum class Order { kForward, kReverse, kShuffled, kWarpsReverse };
struct Schedule {
  Order order = Order::kForward;
  uint64_t seed = 0;  // kShuffled: the first permutation's seed
};
void set_schedule(const Schedule& schedule);
// "forward", "reverse", "shuffled(seed)" or "warps-reverse".
std::string describe(const Schedule& schedule);

// The running emulated thread's built-in variables.
struct ThreadIds {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
const ThreadIds& this_thread();

// Device-side operations (the CUDA built-ins in device.h call these).
void sync_threads();
void sync_warp(unsigned mask);
unsigned active_mask();
// Every lane in `mask` passes `bytes` (at most 16) of its value; each gets the value of lane
// (its lane ^ lane_mask), within groups of `width` lanes.
void shuffle_xor(unsigned mask, void* value, size_t bytes, int lane_mask, int width);
// __all_sync: every lane in `mask` passes its predicate; each gets 1 when all of them are
// nonzero, else 0.
int vote_all(unsigned mask, int predicate);
// A warp-synchronous operation (WMMA): every lane of the warp must reach it together, passing
// the same `arguments` bytes (at most 32: CUDA requires the same pointer and stride in every
// lane). Returns true in the first lane of the warp to go on, which runs before any other
// lane of its warp does, so it may compute a result for all of them in warp_scratch().
bool warp_collective(const char* operation, const void* arguments = nullptr, size_t bytes = 0);
// A per-warp buffer of at least `bytes`, kept until the block ends.
void* warp_scratch(size_t bytes);
// A warp-synchronous operation on values spread over the lanes' registers (mma.sync,
// ldmatrix): every lane of the warp passes `in_bytes` of its own (at most 64) and the same
// `compute`; once all have arrived, `compute` runs once, reading the 32 lanes' inputs
// (lane l's at in + l * in_bytes) and writing their outputs (lane l's at out + l *
// out_bytes, at most 64 each), and each lane gets its own output back in `out`.
using WarpRegisterCompute = void (*)(const unsigned char* in, unsigned char* out);
void warp_register_operation(const char* operation, const void* in, size_t in_bytes, void* out,
                             size_t out_bytes, WarpRegisterCompute compute);
// cp.async with groups, as a thread sees it: a copy is queued, not made; async_commit()
// closes the thread's open group; async_wait(n) makes every copy of the thread's committed
// groups but the newest n (cp.async.wait_group n). So a kernel that reads a tile before
// waiting for it reads the shared memory's poison, or the tile before. A thread's copies
// still queued when it exits are made then, as the hardware completes them.
void async_copy(void* dst, const void* src, size_t bytes, size_t src_bytes);
void async_commit();
void async_wait(int newest_pending);
void* dynamic_shared_memory();
// A static __shared__ array reached by a thread: the first call of each block fills it with
// 0xFF bytes (rewrite_kernel_source.cmake puts the call after each declaration).
void shared_memory_in_use(void* array, size_t bytes);
[[noreturn]] void trap();

// The error a trapped kernel left (cudaErrorLaunchFailure, as a device reports it at the
// next synchronising call); cudaSuccess when none. clear_device_error() starts afresh, as a
// new context would.
cudaError_t device_error();
void clear_device_error();

struct LaunchConfig {
  const void* kernel;
  const char* name;  // as written at the launch site (launch records carry it)
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  cudaStream_t stream;
  ArgumentWords argument_words = {};  // Note [The bytes a launch's arguments name]
};
// Runs `body` as every thread of every block of the grid, now or, on a capturing stream, at
// each launch of the captured graph (Note [Emulated graphs] in stream_capture.h). A
// configuration CUDA refuses sets the error cudaGetLastError() returns, and nothing runs.
void run_grid(const LaunchConfig& config, std::function<void()> body);

namespace detail {

// Adds the words of one converted argument that may be device addresses (Note [The bytes a
// launch's arguments name], work_log.h): a pointer, or each pointer-aligned word of a class.
template <typename T>
void add_argument_words(const T& argument, ArgumentWords& words) {
  if constexpr (std::is_pointer_v<T> && std::is_object_v<std::remove_pointer_t<T>>) {
    words.push_back({argument, std::is_const_v<std::remove_pointer_t<T>>});
  } else if constexpr (std::is_class_v<T>) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(&argument);
    for (size_t at = 0; at + sizeof(void*) <= sizeof(T); at += alignof(void*)) {
      const void* word = nullptr;
      std::memcpy(&word, bytes + at, sizeof(word));
      words.push_back({word, false});
    }
  }
}

}  // namespace detail

// kernel<<<grid, block, shared, stream>>>(args...) is rewritten into
// launch(kernel, grid, block, shared, stream)(args...): the arguments are converted to the
// kernel's parameter types once, as a launch does (a captured launch keeps them), and every
// thread gets its own copy.
template <typename... Params>
class Launch {
 public:
  Launch(void (*kernel)(Params...), const LaunchConfig& config)
      : kernel_(kernel), config_(config) {}

  template <typename... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "kernel launched with the wrong arity");
    const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    LaunchConfig config = config_;
    std::apply(
        [&](const auto&... p) { (detail::add_argument_words(p, config.argument_words), ...); },
        params);
    run_grid(config, [kernel = kernel_, params] { std::apply(kernel, params); });
  }

 private:
  void (*kernel_)(Params...);
  LaunchConfig config_;
};

// rewrite_kernel_source.cmake passes the kernel's name as written at the launch site; a
// test's own kernels may go without one.
template <typename... Params>
Launch<Params...> launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                         size_t shared_bytes = 0, cudaStream_t stream = nullptr) {
  return Launch<Params...>(kernel, LaunchConfig{reinterpret_cast<const void*>(kernel), name, grid,
                                                block, shared_bytes, stream});
}

template <typename... Params>
Launch<Params...> launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes = 0,
                         cudaStream_t stream = nullptr) {
  return launch("kernel", kernel, grid, block, shared_bytes, stream);
}

}  // namespace loom::cuda_emulation
