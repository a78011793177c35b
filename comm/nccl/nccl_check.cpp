#include "comm/nccl/nccl_check.h"

#include <string>

#include "comm/error.h"
#include "core/error.h"
#include "core/tags.h"

namespace loom::comm::nccl::detail {

void throw_nccl_error(ncclResult_t result, ncclComm_t comm, const char* call, const char* file,
                      int line) {
  int rank = -1;
  if (comm != nullptr && ncclCommUserRank(comm, &rank) != ncclSuccess) rank = -1;
  const char* last = ncclGetLastError(comm);
  std::string message = tag::kCommNccl.prefix();
  if (rank >= 0) message += "rank " + std::to_string(rank) + ": ";
  message += std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
             ncclGetErrorString(result);
  if (last != nullptr && *last != '\0') message += " (NCCL: " + std::string(last) + ")";
  switch (result) {
    case ncclInvalidArgument:
    case ncclInvalidUsage: throw Error(message);
    default:
      throw CommError(message +
                          "; the communicator is unusable: destroy the process group and "
                          "create a new one",
                      rank);
  }
}

}  // namespace loom::comm::nccl::detail
