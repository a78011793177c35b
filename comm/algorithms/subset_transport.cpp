#include "comm/algorithms/subset_transport.h"

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "core/tags.h"

namespace loom::comm::algorithms {

SubsetTransport::SubsetTransport(Transport& whole, std::vector<int> members)
    : whole_(whole), members_(std::move(members)) {
  std::vector<int> sorted = members_;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= whole.size() || (i > 0 && sorted[i] == sorted[i - 1])) {
      tag::kCommAlgorithms.fail("SubsetTransport: member ", sorted[i],
                                " is repeated or not a rank of a group of size ", whole.size());
    }
  }
  const auto me = std::find(members_.begin(), members_.end(), whole.rank());
  if (me == members_.end()) {
    tag::kCommAlgorithms.fail("SubsetTransport: rank ", whole.rank(), " is not one of the members");
  }
  rank_ = static_cast<int>(me - members_.begin());
}

int SubsetTransport::whole_rank(int subset_rank) const {
  if (subset_rank < 0 || subset_rank >= size()) {
    tag::kCommAlgorithms.fail("SubsetTransport: rank ", subset_rank,
                              " is not a rank of a subset of size ", size());
  }
  return members_[static_cast<size_t>(subset_rank)];
}

void SubsetTransport::send(const void* data, size_t bytes, int dst, Deadline deadline) {
  whole_.send(data, bytes, whole_rank(dst), deadline);
}

void SubsetTransport::recv(void* data, size_t bytes, int src, Deadline deadline) {
  whole_.recv(data, bytes, whole_rank(src), deadline);
}

void SubsetTransport::send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                                size_t recv_bytes, int src, Deadline deadline) {
  whole_.send_recv(send_data, send_bytes, whole_rank(dst), recv_data, recv_bytes, whole_rank(src),
                   deadline);
}

}  // namespace loom::comm::algorithms
