#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/tags.h"

namespace loom::kernels::cpu {

namespace {

// Note [Spinning workers]
// A training step runs a few hundred parallel kernels, each a few tens of microseconds per
// thread, so waking a sleeping worker (a futex round trip, tens of microseconds) would cost
// a good share of the gain. Workers and the caller therefore spin for up to kSpin on an
// atomic before they sleep on a condition variable, as OpenMP runtimes do; a worker idle
// longer than that sleeps and costs nothing.
constexpr auto kSpin = std::chrono::microseconds(200);

void pause_briefly() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or kSpin has passed; returns done(). After a short busy wait it
// yields the core at each turn, so that spinning costs little where threads outnumber
// cores (ranks sharing a machine with --threads too high).
template <typename Done>
bool spin_until(const Done& done) {
  const auto give_up = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (done()) return true;
    if (i < 256) {
      pause_briefly();
      continue;
    }
    std::this_thread::yield();
    if (std::chrono::steady_clock::now() > give_up) return done();
  }
}

// Workers wait for a job to be posted; each runs the chunk of its index, then counts down.
class Pool {
 public:
  ~Pool() { resize(0); }

  void resize(int workers) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : threads_)
      t.join();
    threads_.clear();
    stopping_ = false;
    // New workers wait for the next job, not one posted before they existed.
    for (int w = 0; w < workers; ++w)
      threads_.emplace_back([this, w, seen = posted_.load()] { work(w + 1, seen); });
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  // Runs chunk(0) .. chunk(chunks - 1), or returns false at once when another thread is
  // running a job.
  bool try_run(int chunks, const std::function<void(int)>& chunk) {
    std::unique_lock caller(running_, std::try_to_lock);
    if (!caller.owns_lock()) return false;
    run(chunks, chunk);
    return true;
  }

 private:
  void run(int chunks, const std::function<void(int)>& chunk) {
    {
      std::lock_guard lock(mutex_);
      job_ = &chunk;
      error_ = nullptr;
      pending_.store(chunks - 1);
      const uint64_t generation = (posted_.load() >> kChunkBits) + 1;
      posted_.store(generation << kChunkBits | static_cast<uint64_t>(chunks),
                    std::memory_order_release);  // publishes the job
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      chunk(0);
    } catch (...) {
      mine = std::current_exception();
    }
    if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return pending_.load() == 0; });
    }
    std::lock_guard lock(mutex_);
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

  // `seen`: the last posted_ word this worker took.
  void work(int index, uint64_t seen) {
    while (true) {
      auto posted = [&] {
        return stopping_.load() || posted_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(posted)) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, posted);
      }
      if (stopping_.load()) return;
      // One load gives the job's number and its chunk count together. A worker with no
      // chunk in it reads nothing else: the caller may already be posting the next job.
      seen = posted_.load(std::memory_order_acquire);
      const int chunks = static_cast<int>(seen & ((uint64_t{1} << kChunkBits) - 1));
      if (index >= chunks) continue;
      std::exception_ptr error;
      try {
        (*job_)(index);
      } catch (...) {
        error = std::current_exception();
      }
      if (error) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = error;
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mutex_);  // the caller may be about to sleep: wake it under the lock
        done_.notify_one();
      }
    }
  }

  std::mutex running_;  // held by the thread whose job runs
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  // The job, written before posted_ moves on and read by the workers with a chunk in it
  // (the caller waits for them before it posts again); posted_ = job number << kChunkBits |
  // its chunk count.
  static constexpr int kChunkBits = 20;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<int> pending_{0};
  std::atomic<uint64_t> posted_{0};
  std::atomic<bool> stopping_{false};
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool instance;
  return instance;
}

int& configured_threads() {
  static int n = 1;
  return n;
}

thread_local bool inside_parallel_for = false;

}  // namespace

void set_num_threads(int n) {
  if (n < 1 || n > (1 << 20)) {
    throw Error(tag::kKernels.prefix() + "set_num_threads: need 1 to 2^20 threads, got " +
                std::to_string(n));
  }
  configured_threads() = n;
  pool().resize(n - 1);
}

int num_threads() {
  return configured_threads();
}

void parallel_for(int64_t n, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end)>& body) {
  if (n <= 0) return;
  const int64_t by_grain = (n + std::max<int64_t>(grain, 1) - 1) / std::max<int64_t>(grain, 1);
  const int chunks = static_cast<int>(std::min<int64_t>(num_threads(), by_grain));
  if (chunks <= 1 || inside_parallel_for) {
    body(0, n);
    return;
  }
  const bool ran = pool().try_run(chunks, [&](int i) {
    inside_parallel_for = true;
    body(n * i / chunks, n * (i + 1) / chunks);
    inside_parallel_for = false;
  });
  if (!ran) body(0, n);
}

void parallel_rows(int64_t rows, int64_t width,
                   const std::function<void(int64_t begin, int64_t end)>& body) {
  const int64_t grain =
      (kMinParallelElements + std::max<int64_t>(width, 1) - 1) / std::max<int64_t>(width, 1);
  parallel_for(rows, grain, body);
}

}  // namespace loom::kernels::cpu
