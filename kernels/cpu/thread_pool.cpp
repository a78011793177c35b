#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensor/error.h"

namespace loom::kernels::cpu {

namespace {

// Workers sleep until a job is posted; each runs the chunk of its index, then counts down.
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
      threads_.emplace_back([this, w, seen = generation_] { work(w + 1, seen); });
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
      chunks_ = chunks;
      pending_ = chunks - 1;
      error_ = nullptr;
      ++generation_;
    }
    wake_.notify_all();
    std::exception_ptr mine;
    try {
      chunk(0);
    } catch (...) {
      mine = std::current_exception();
    }
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    if (mine) std::rethrow_exception(mine);
    if (error_) std::rethrow_exception(error_);
  }

  void work(int index, uint64_t seen) {
    while (true) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        if (index >= chunks_) continue;  // fewer chunks than workers this time
        job = job_;
      }
      std::exception_ptr error;
      try {
        (*job)(index);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard lock(mutex_);
      if (error && !error_) error_ = error;
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex running_;  // held by the thread whose job runs
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* job_ = nullptr;
  int chunks_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
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
  if (n < 1) {
    throw Error("[kernels] set_num_threads: need at least 1 thread, got " + std::to_string(n));
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
