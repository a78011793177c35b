#include "fake_nccl.h"

#include <utility>

namespace loom::fake_nccl {
namespace {
Script current;
Counts tally;
}  // namespace

void reset(const Script& s) {
  current = s;
  tally = Counts{};
}
Script& script() { return current; }
const Counts& counts() { return tally; }

}  // namespace loom::fake_nccl

using loom::fake_nccl::current;
using loom::fake_nccl::tally;

// A fake communicator: how many more polls it stays in progress, and the handle a split of
// it delivers when that progress ends.
struct ncclComm {
  int rank = 0;
  int polls_left = 0;
  ncclComm** split_slot = nullptr;
  ncclComm* split_child = nullptr;
};

namespace {
ncclComm* make(int rank) {
  ++tally.created;
  return new ncclComm{rank, current.polls_in_progress};
}
ncclResult_t issued(ncclComm* comm) {
  if (current.issue == ncclInProgress) comm->polls_left = current.polls_in_progress;
  return current.issue;
}
}  // namespace

extern "C" {

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int, ncclUniqueId, int rank, ncclConfig_t*) {
  *comm = make(rank);
  return issued(*comm);
}

// As NCCL 2.28 does with a non-blocking parent: returns ncclSuccess at once, keeps the
// parent in progress, and stores the new handle only when that progress ends.
ncclResult_t ncclCommSplit(ncclComm_t comm, int, int, ncclComm_t* newcomm, ncclConfig_t*) {
  *newcomm = nullptr;
  comm->split_slot = newcomm;
  comm->split_child = current.split_gives_none ? nullptr : make(comm->rank);
  if (comm->split_child != nullptr) issued(comm->split_child);
  comm->polls_left = current.polls_in_progress;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state) {
  ++tally.polls;
  if (current.forever_in_progress || comm->polls_left > 0) {
    --comm->polls_left;
    *state = ncclInProgress;
  } else {
    *state = current.settled;
    if (comm->split_slot != nullptr) *std::exchange(comm->split_slot, nullptr) = comm->split_child;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ++tally.finalized;
  return issued(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  ++tally.destroyed;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  ++tally.aborted;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  *rank = comm->rank;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "fake NCCL error";
  }
}

const char* ncclGetLastError(ncclComm_t) { return current.last_error.c_str(); }

}  // extern "C"
