#include "comm/nccl/communicator.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "comm/nccl/nccl_check.h"
#include "core/tags.h"

namespace loom::comm::nccl {

namespace {

// How long the destructor of a communicator that was not closed waits for it to flush.
constexpr auto kCloseGrace = std::chrono::seconds(10);

// How long abort() waits for ncclCommAbort before leaving it to finish in the background:
// well inside the second of grace that Work::wait gives a backend past an operation's
// timeout, so that the watchdog's error, not the generic one, reaches the caller.
constexpr auto kAbortWait = std::chrono::milliseconds(250);

// Between polls of a communicator's state: yield at first (most calls finish within
// microseconds), then sleep so that a long wait (creation, a slow peer) does not burn a core.
void pause(unsigned polls) {
  if (polls < 2048) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

ncclConfig_t non_blocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace

Communicator Communicator::create(const ncclUniqueId& id, int rank, int size, Deadline deadline,
                                  std::string who) {
  ncclConfig_t config = non_blocking_config();
  ncclComm_t raw = nullptr;
  Communicator result(nullptr, std::move(who));
  ncclResult_t issued = ncclSuccess;
  try {
    issued = LOOM_NCCL_CHECK(ncclCommInitRankConfig(&raw, size, id, rank, &config), nullptr);
  } catch (...) {
    result.comm_ = raw;  // whatever NCCL left behind is aborted by the destructor
    result.broken_ = true;
    throw;
  }
  result.comm_ = raw;
  result.settle(issued, deadline, "creating the communicator (waiting for every rank to join)");
  return result;
}

Communicator::~Communicator() {
  close(deadline_after(std::chrono::duration_cast<Duration>(kCloseGrace)));
}

Communicator::Communicator(Communicator&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      aborted_(other.aborted_),
      broken_(other.broken_),
      who_(std::move(other.who_)),
      split_slots_(std::move(other.split_slots_)) {}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    close(deadline_after(std::chrono::duration_cast<Duration>(kCloseGrace)));
    comm_ = std::exchange(other.comm_, nullptr);
    aborted_ = other.aborted_;
    broken_ = other.broken_;
    who_ = std::move(other.who_);
    split_slots_ = std::move(other.split_slots_);
  }
  return *this;
}

Communicator Communicator::split(int color, int key, Deadline deadline, std::string who) {
  ncclConfig_t config = non_blocking_config();
  // A non-blocking ncclCommSplit returns ncclSuccess while the split goes on in NCCL's own
  // thread, which stores the new handle into the slot when it is done (the GPU check of
  // 2026-11-27, NCCL 2.28, found it still null on return). So the slot is polled until
  // filled. It belongs to this communicator until then, and for good when the split fails
  // or has no color (NCCL then stores null, with no handle to show when): NCCL may write to
  // it after this function has returned or thrown, but not after this communicator is gone.
  auto& slot = split_slots_.emplace_back(std::make_unique<ncclComm_t>(nullptr));
  std::atomic_ref<ncclComm_t> handle(*slot);
  try {
    LOOM_NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, slot.get(),
                                  &config),
                    comm_);
    settle(ncclInProgress, deadline, "ncclCommSplit");  // the parent, until the split is done
    for (unsigned polls = 0; color >= 0 && handle.load(std::memory_order_acquire) == nullptr;
         ++polls) {
      if (Clock::now() >= deadline) {
        abort();
        throw CommError(who_ +
                            ": ncclCommSplit made no communicator by its deadline; the "
                            "communicator was aborted (ncclCommAbort): destroy the process "
                            "group and create a new one",
                        -1);
      }
      pause(polls);
    }
  } catch (const CommError&) {
    broken_ = true;
    throw;
  }
  Communicator child(handle.load(std::memory_order_acquire), std::move(who));
  if (color >= 0) split_slots_.pop_back();  // delivered: NCCL is done with it
  if (child.valid()) child.settle(ncclInProgress, deadline, "ncclCommSplit (the new communicator)");
  return child;
}

void Communicator::settle(ncclResult_t issued, Deadline deadline, const char* what) {
  if (issued == ncclSuccess) return;
  try {
    for (unsigned polls = 0;; ++polls) {
      ncclResult_t state = ncclInProgress;
      LOOM_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state), comm_);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail_async(state, what);
      if (Clock::now() >= deadline) {
        abort();
        throw CommError(who_ + ": " + what +
                            " did not finish by its deadline; the communicator was aborted "
                            "(ncclCommAbort): destroy the process group and create a new one",
                        -1);
      }
      pause(polls);
    }
  } catch (const CommError&) {
    broken_ = true;
    throw;
  }
}

void Communicator::check_async(const char* what) {
  if (comm_ == nullptr) return;
  ncclResult_t state = ncclSuccess;
  try {
    LOOM_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state), comm_);
  } catch (const CommError&) {
    broken_ = true;
    throw;
  }
  if (state != ncclSuccess && state != ncclInProgress) fail_async(state, what);
}

void Communicator::fail_async(ncclResult_t state, const char* what) {
  broken_ = true;
  std::string message = who_ + ": " + what + " failed: " + ncclGetErrorString(state);
  const char* last = ncclGetLastError(comm_);
  if (last != nullptr && *last != '\0') message += " (NCCL: " + std::string(last) + ")";
  abort();
  throw CommError(message +
                      "; the communicator was aborted: destroy the process group and create a "
                      "new one",
                  -1);
}

void Communicator::abort() noexcept {
  broken_ = true;
  if (comm_ == nullptr) return;
  aborted_ = true;
  // On a helper thread, waited for at most kAbortWait: ncclCommAbort frees device memory,
  // which waits for every stream of the device, so a stream held up by other work (the
  // GPU check saw a host function do it) would otherwise keep the caller from its error.
  ncclComm_t comm = std::exchange(comm_, nullptr);
  std::optional<ncclResult_t> result;
  try {
    std::promise<ncclResult_t> done;
    std::future<ncclResult_t> outcome = done.get_future();
    std::thread([comm, done = std::move(done)]() mutable {
      done.set_value(ncclCommAbort(comm));
    }).detach();
    if (outcome.wait_for(kAbortWait) == std::future_status::ready) result = outcome.get();
  } catch (const std::system_error&) {  // no thread to be had: abort here
    result = ncclCommAbort(comm);
  }
  if (!result) {
    std::fprintf(stderr,
                 "%swarning: %s: ncclCommAbort is still running after %lld ms (the device is "
                 "busy with other work); it goes on in the background\n",
                 tag::kLoom.prefix().c_str(), who_.c_str(),
                 static_cast<long long>(kAbortWait.count()));
  } else if (*result != ncclSuccess) {
    std::fprintf(stderr, "%swarning: %s: ncclCommAbort failed: %s\n", tag::kLoom.prefix().c_str(),
                 who_.c_str(), ncclGetErrorString(*result));
  }
}

void Communicator::close(Deadline deadline) noexcept {
  if (comm_ == nullptr) return;
  if (broken_) return abort();
  ncclResult_t state = ncclCommFinalize(comm_);
  for (unsigned polls = 0; state == ncclInProgress; ++polls) {
    if (Clock::now() >= deadline) break;
    pause(polls);
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
  }
  if (state != ncclSuccess) return abort();
  ncclResult_t result = ncclCommDestroy(std::exchange(comm_, nullptr));
  if (result != ncclSuccess) {
    std::fprintf(stderr, "%swarning: %s: ncclCommDestroy failed: %s\n", tag::kLoom.prefix().c_str(),
                 who_.c_str(), ncclGetErrorString(result));
  }
}

}  // namespace loom::comm::nccl
