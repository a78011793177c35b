#include "comm/work.h"

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <utility>

#include "core/tags.h"

namespace loom::comm {

// Requests of at most 128 bytes are served from glibc's fast bins (DEFAULT_MXFAST) when its
// per-thread cache is full, as it is after a burst of calls frees its Works together;
// make_shared adds a 16-byte control block.
static_assert(sizeof(Work) + 16 <= 128, "a Work no longer fits glibc's fast bins");

std::string OpLabel::str() const {
  char size[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
    std::snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
  } else if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) {
    std::snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
  } else {
    std::snprintf(size, sizeof size, "%zu B", bytes);
  }
  std::string text = std::string(kind) + " #" + std::to_string(seq);
  if (!dtype.empty()) text += ", " + std::string(size) + " " + std::string(dtype);
  if (peer >= 0) text += (to_peer ? " to rank " : " from rank ") + std::to_string(peer);
  return text;
}

// Note [Waiting stripes]
// Most Works are never slept on: small operations complete before anyone waits. So a Work
// carries no mutex or condition variable of its own (making and destroying them cost a
// tenth of a small call); a thread that must sleep uses the stripe its Work's address
// hashes to, one of kStripes shared by all Works. complete() notifies the whole stripe,
// and each sleeper rechecks its own Work, so sharing costs at most a spurious wake-up.
namespace {
constexpr size_t kStripes = 64;
struct alignas(64) Stripe {
  std::mutex mutex;
  std::condition_variable done;
};
Stripe& stripe_of(const Work* work) {
  static Stripe* stripes = new Stripe[kStripes];  // outlives threads still waiting at exit
  return stripes[(reinterpret_cast<uintptr_t>(work) >> 6) % kStripes];
}
}  // namespace

// Note [Work completion]
// complete() stores error_, then sets completed_ (seq_cst), then notifies only if a waiter
// registered. wait() registers in waiters_ (seq_cst) before it checks completed_ under the
// stripe's mutex. Whichever of the two stores comes first, the other side sees it: either
// the waiter finds completed_ set, or complete() finds a waiter and notifies under the
// mutex, which the waiter holds from its check until it sleeps.
namespace {
thread_local WaitObserver* installed_wait_observer = nullptr;
}  // namespace

WaitObserver* set_wait_observer(WaitObserver* observer) {
  return std::exchange(installed_wait_observer, observer);
}

WaitObserver* wait_observer() { return installed_wait_observer; }

void Work::wait_until_done(const Duration* timeout) {
  if (WaitObserver* observer = installed_wait_observer) {
    observer->waiting(*this);
  }
  if (completed_.load()) {
    if (error_) std::rethrow_exception(error_);
    return;
  }
  if (Claimer* claimer = claimer_.exchange(nullptr, std::memory_order_acquire)) {
    if (claimer->claim(label_.seq)) {  // ran here: complete() was called
      if (error_) std::rethrow_exception(error_);
      return;
    }
  }
  Stripe& stripe = stripe_of(this);
  if (!completed_.load()) {
    waiters_.fetch_add(1);
    std::unique_lock lock(stripe.mutex);
    auto done = [&] { return completed_.load(); };
    bool finished = true;
    if (timeout != nullptr) {
      finished = stripe.done.wait_for(lock, *timeout, done);
    } else {
      const auto grace = std::chrono::seconds(1);
      while (!stripe.done.wait_for(lock, std::chrono::milliseconds(100), done)) {
        Clock::rep started = started_.load();
        if (started != 0 &&
            Clock::now() > Clock::time_point(Clock::duration(started)) + default_timeout_ + grace) {
          finished = false;
          break;
        }
      }
    }
    waiters_.fetch_sub(1);
    if (!finished) {
      throw CommError(tag::kComm.prefix() + description() + " did not complete within " +
                      duration_str(timeout != nullptr ? *timeout : default_timeout_));
    }
  }
  if (error_) std::rethrow_exception(error_);
}

std::optional<Clock::time_point> Work::started_at() const {
  const Clock::rep at = started_.load(std::memory_order_relaxed);
  if (at == 0) return std::nullopt;
  return Clock::time_point(Clock::duration(at));
}

std::optional<Clock::time_point> Work::completed_at() const {
  if (!completed_.load()) return std::nullopt;
  const Clock::rep at = completed_at_.load(std::memory_order_relaxed);
  if (at == 0) return std::nullopt;
  return Clock::time_point(Clock::duration(at));
}

std::exception_ptr Work::exception() const {
  return completed_.load() ? error_ : nullptr;
}

void Work::wake_waiters() {
  Stripe& stripe = stripe_of(this);
  std::lock_guard lock(stripe.mutex);
  stripe.done.notify_all();
}

}  // namespace loom::comm
