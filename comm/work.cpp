#include "comm/work.h"

namespace loom::comm {

void Work::wait(std::optional<Duration> timeout) {
  std::unique_lock lock(mutex_);
  if (timeout) {
    if (!done_.wait_for(lock, *timeout, [&] { return completed_; })) {
      throw CommError("[comm] " + description_ + " did not complete within " +
                      duration_str(*timeout));
    }
  } else {
    const auto grace = std::chrono::seconds(1);
    while (!done_.wait_for(lock, std::chrono::milliseconds(100), [&] { return completed_; })) {
      if (started_ && Clock::now() > *started_ + default_timeout_ + grace) {
        throw CommError("[comm] " + description_ + " did not complete within its timeout of " +
                        duration_str(default_timeout_));
      }
    }
  }
  if (error_) std::rethrow_exception(error_);
}

void Work::mark_started() {
  std::lock_guard lock(mutex_);
  started_ = Clock::now();
}

bool Work::is_completed() const {
  std::lock_guard lock(mutex_);
  return completed_;
}

std::exception_ptr Work::exception() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void Work::complete(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    completed_ = true;
    error_ = std::move(error);
  }
  done_.notify_all();
}

}  // namespace loom::comm
