#pragma once
// The one checker for NCCL calls:
//   LOOM_NCCL_CHECK(ncclAllReduce(in, out, n, type, op, comm, stream), comm);
// evaluates the call and returns its result when it is ncclSuccess or ncclInProgress (a
// non-blocking communicator is still working: the caller polls ncclCommGetAsyncError, see
// Communicator::settle). Any other result throws, with the call, where it was made,
// ncclGetErrorString and ncclGetLastError:
//   - loom::Error for misuse (ncclInvalidArgument, ncclInvalidUsage): a Loom bug or a bad
//     argument, the communicator is still usable;
//   - loom::CommError for failures of peers, transports and devices (ncclSystemError,
//     ncclRemoteError, ncclInternalError, ncclUnhandledCudaError): the communicator must be
//     aborted and the group rebuilt.
// `communicator` (may be null) names the rank in the message.

#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "Loom's NCCL backend needs NCCL 2.18 or newer (ncclCommSplit, non-blocking communicators)"
#endif

namespace loom::comm::nccl::detail {

[[noreturn]] void throw_nccl_error(ncclResult_t result, ncclComm_t comm, const char* call,
                                   const char* file, int line);

inline ncclResult_t check_nccl(ncclResult_t result, ncclComm_t comm, const char* call,
                               const char* file, int line) {
  if (result != ncclSuccess && result != ncclInProgress) {
    throw_nccl_error(result, comm, call, file, line);
  }
  return result;
}

}  // namespace loom::comm::nccl::detail

#define LOOM_NCCL_CHECK(call, communicator) \
  ::loom::comm::nccl::detail::check_nccl((call), (communicator), #call, __FILE__, __LINE__)
