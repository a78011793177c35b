#pragma once
// A scriptable stand-in for libnccl, linked in its place, so that Loom's communicator logic
// (comm/nccl/communicator.cpp: settling non-blocking calls within a deadline, the abort and
// close paths) runs on a machine without a GPU. Only the calls that code makes exist; a new
// call is a link error, not a silent success.

#include <nccl.h>

#include <string>

namespace loom::fake_nccl {

// How every fake communicator behaves from the next call on.
struct Script {
  ncclResult_t issue = ncclInProgress;      // what init, split and finalize return
  int polls_in_progress = 3;                // ncclCommGetAsyncError: in progress this often
  bool forever_in_progress = false;         // ... or always
  ncclResult_t settled = ncclSuccess;       // then this (an error: the async failure)
  std::string last_error;                   // what ncclGetLastError reports
  bool split_gives_none = false;            // ncclCommSplit yields no communicator (NOCOLOR)
};

struct Counts {
  int created = 0, aborted = 0, finalized = 0, destroyed = 0, polls = 0;
  int alive() const { return created - aborted - destroyed; }
};

void reset(const Script& script);  // forgets every count
Script& script();                  // changes apply to later calls
const Counts& counts();

}  // namespace loom::fake_nccl
