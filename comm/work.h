#pragma once
// Work: the handle of one asynchronous operation. The process group's progress thread
// completes it, with an error when the operation failed; wait() blocks (never longer than
// its timeout) and rethrows that error.

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "comm/error.h"

namespace loom::comm {

class Work {
 public:
  explicit Work(std::string description, Duration default_timeout = kDefaultTimeout)
      : description_(std::move(description)), default_timeout_(default_timeout) {}

  // Blocks until the operation finished, then rethrows its error if it failed. With a
  // `timeout`, throws loom::CommError when it passes first. Without one, waits while the
  // operation is queued behind others (each of which is bounded by its own timeout) and at
  // most the operation's timeout (plus a second of grace) once it has started.
  // Thread-safe; may be called any number of times.
  void wait(std::optional<Duration> timeout = std::nullopt);
  bool is_completed() const;
  // The error of a failed operation (null while running or after success).
  std::exception_ptr exception() const;
  const std::string& description() const { return description_; }  // "allreduce #12, 4 MiB f32"

  // Called by the thread that runs the operation: once when it starts, once when it ends.
  void mark_started();
  void complete(std::exception_ptr error = nullptr);

 private:
  std::string description_;
  Duration default_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  bool completed_ = false;
  std::optional<Clock::time_point> started_;
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace loom::comm
