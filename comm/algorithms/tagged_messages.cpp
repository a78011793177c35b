#include "comm/algorithms/tagged_messages.h"

#include <string>

namespace loom::comm::algorithms {

namespace {

struct MessageHeader {
  int64_t tag;
  uint64_t bytes;
};

}  // namespace

void send_tagged(Transport& transport, const void* data, size_t bytes, int64_t tag, int dst,
                 Deadline deadline) {
  const MessageHeader header{tag, bytes};
  transport.send(&header, sizeof header, dst, deadline);
  if (bytes > 0) transport.send(data, bytes, dst, deadline);
}

void recv_tagged(Transport& transport, void* data, size_t bytes, int64_t tag, int src,
                 Deadline deadline, const char* backend) {
  MessageHeader header{};
  transport.recv(&header, sizeof header, src, deadline);
  if (header.tag != tag || header.bytes != bytes) {
    const int rank = transport.rank();
    throw CommError(std::string(backend) + " rank " + std::to_string(rank) + ": recv from rank " +
                        std::to_string(src) + " expected tag " + std::to_string(tag) + " and " +
                        std::to_string(bytes) + " bytes, but the next message has tag " +
                        std::to_string(header.tag) + " and " + std::to_string(header.bytes) +
                        " bytes (sends and recvs between two ranks must match in order)",
                    rank, src);
  }
  if (bytes > 0) transport.recv(data, bytes, src, deadline);
}

}  // namespace loom::comm::algorithms
