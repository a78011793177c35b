#pragma once
// Communicator: owns one non-blocking NCCL communicator (ncclComm_t).
//
// Non-blocking (config.blocking = 0): no NCCL call ever blocks the calling thread; a call that
// has more to do returns ncclInProgress and the communicator stays "in progress" until
// ncclCommGetAsyncError says otherwise. settle() polls that state, bounded by a deadline, so
// that creation (which waits for every rank) and every enqueue respect the operation's
// timeout. A communicator that failed or missed a deadline is aborted (ncclCommAbort, which
// also stops its kernels) and unusable afterwards.
//
// Not thread-safe: one thread at a time (the process group's progress thread). Move-only.

#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"

namespace loom::comm::nccl {

class Communicator {
 public:
  Communicator() = default;
  // Collective over the `size` ranks that share `id`: creates this rank's communicator on
  // the calling thread's current device and waits until every rank joined, or until
  // `deadline` (then CommError). `who` prefixes messages: "[comm/nccl] rank 3 (group x)".
  static Communicator create(const ncclUniqueId& id, int rank, int size, Deadline deadline,
                             std::string who);
  ~Communicator();  // see close(); never throws
  Communicator(Communicator&& other) noexcept;
  Communicator& operator=(Communicator&& other) noexcept;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // Collective over this communicator (ncclCommSplit, in its issue order): every rank calls
  // it; ranks with equal color >= 0 form a new communicator ordered by key; color < 0 joins
  // none and returns an empty Communicator. Waits until the new one is ready or `deadline`.
  Communicator split(int color, int key, Deadline deadline, std::string who);

  ncclComm_t get() const { return comm_; }
  bool valid() const { return comm_ != nullptr; }
  bool aborted() const { return aborted_; }

  // After a call on this communicator returned `issued` (ncclSuccess or ncclInProgress):
  // waits until the communicator left the in-progress state. Throws CommError naming `what`
  // on an asynchronous error, or at `deadline` after aborting the communicator.
  void settle(ncclResult_t issued, Deadline deadline, const char* what);
  // Throws CommError (after aborting) when the communicator reports an asynchronous error,
  // e.g. a peer that failed. Does not block.
  void check_async(const char* what);
  // ncclCommAbort: stops whatever this communicator has running on the device and frees it.
  // Returns within about 250 ms even when the device is held up by other work (the abort
  // then finishes in the background, with a warning on stderr). Idempotent; never throws.
  void abort() noexcept;
  // Finalizes and destroys a healthy communicator, waiting at most until `deadline` for it
  // to flush; aborts it instead when it is broken or the deadline passes. Never throws.
  void close(Deadline deadline) noexcept;

  const std::string& who() const { return who_; }

 private:
  Communicator(ncclComm_t comm, std::string who) : comm_(comm), who_(std::move(who)) {}
  [[noreturn]] void fail_async(ncclResult_t state, const char* what);

  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  bool broken_ = false;  // an error was seen: close() aborts
  std::string who_;
  std::vector<std::unique_ptr<ncclComm_t>> split_slots_;  // see split(): NCCL may still write
};

}  // namespace loom::comm::nccl
