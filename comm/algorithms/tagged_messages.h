#pragma once
// Tagged messages over the point-to-point Transport: ProcessGroup send/recv on a backend that
// is a Transport (shm, ucx). Each message is a header (tag and size) followed by the bytes;
// the receiver checks both, so sends and recvs between two ranks must match in order.

#include <cstddef>
#include <cstdint>

#include "comm/algorithms/transport.h"
#include "comm/error.h"

namespace loom::comm::algorithms {

void send_tagged(Transport& transport, const void* data, size_t bytes, int64_t tag, int dst,
                 Deadline deadline);
// CommError naming `src` when the next message from it has another tag or size; `backend`
// is the message's prefix, e.g. "[comm/shm]".
void recv_tagged(Transport& transport, void* data, size_t bytes, int64_t tag, int src,
                 Deadline deadline, const char* backend);

}  // namespace loom::comm::algorithms
