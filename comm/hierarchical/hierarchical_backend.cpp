#include "comm/hierarchical/hierarchical_backend.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/reduce_op.h"
#include "comm/shm/shm_backend.h"
#include "comm/store/store.h"
#include "comm/tcp/tcp_backend.h"
#include "core/tags.h"
#include "core/tunables.h"
#if LOOM_WITH_UCX
#include "comm/ucx/ucx_backend.h"
#endif

namespace loom::comm::hierarchical {

// Note [Hierarchical collectives]
// With H hosts of L ranks each, numbered host by host (rank = host * L + local), the three
// levels of an allreduce of n elements are:
//   1. intra-host reduce-scatter (shm): the data, padded to L * ceil(n / L), is split into
//      L shards; local rank l gets its host's sum of shard l;
//   2. inter-host allreduce (the network backend, Note [The network between hosts]) of
//      shard l among the H ranks of local rank l: only 1/L of the data crosses hosts from
//      each rank, and every inter-host link is busy. These H ranks talk over the flat
//      network group's connections (a SubsetTransport), so a group has one connection per
//      pair of ranks, and the rank-ordered reductions give the network backend's bits;
//   3. intra-host all-gather (shm) of the shards.
// Avg reduces as Sum and scales the shard once after step 2, so every rank gets the same
// bits. reduce-scatter arranges the input so that local rank l's intra-host share holds the
// slices of the ranks with local index l on every host; after the intra-host reduce-scatter
// an inter-host reduce-scatter leaves each rank its own slice. all-gather runs the same two
// steps the other way round.

// Note [The network between hosts]
// The flat group of a group that spans hosts is a network backend: tcp, or ucx where an RDMA
// device exists (and the build has UCX), where UCX's rendezvous is zero-copy. Over TCP, tcp
// receives each message straight into its buffer while UCX's TCP transport copies it out of
// its own segments: between two namespace hosts with 2 ranks each, the hierarchical
// allreduce over tcp took 0.59x, 0.92x and 0.91x the time over ucx at 1, 4 and 16 MiB
// (docs/performance_comm.md, "the tcp backend"). LOOM_HIERARCHICAL_NETWORK=tcp|ucx chooses.

namespace {

std::unique_ptr<TransportBackend> network_backend(const BackendContext& context) {
  const char* set = tunable_value(tunables::kHierarchicalNetwork);
  const std::string choice = set != nullptr && *set != '\0' ? set : "auto";
  if (choice != "auto" && choice != "tcp" && choice != "ucx") {
    tag::kComm.fail(tunables::kHierarchicalNetwork.name, "='", choice,
                    "' is not a network of the hierarchical backend; expected tcp, ucx or auto");
  }
#if LOOM_WITH_UCX
  if (choice == "ucx" || (choice == "auto" && has_rdma_device())) {
    return std::make_unique<ucx::UcxBackend>(context);
  }
#else
  if (choice == "ucx") {
    tag::kComm.fail(tunables::kHierarchicalNetwork.name,
                    "=ucx, but this build has no ucx backend: install UCX (Debian: libucx-dev) "
                    "and configure again, or choose tcp");
  }
#endif
  return std::make_unique<tcp::TcpBackend>(context);
}

// This process's host: LOOM_HOST_ID, else the host name and the network namespace.
std::string host_key() {
  if (const char* id = tunable_value(tunables::kHostId); id != nullptr && *id != '\0') {
    return std::string("id:") + id;
  }
  char name[HOST_NAME_MAX + 1] = {};
  gethostname(name, sizeof name - 1);
  std::error_code ignored;
  const std::string net = std::filesystem::read_symlink("/proc/self/ns/net", ignored).string();
  return std::string(name) + "/" + net;
}

BackendContext sub_context(const BackendContext& whole, const std::string& part, int rank,
                           int size) {
  return {.rank = rank,
          .size = size,
          .store = std::make_shared<PrefixStore>("hierarchical/" + part, whole.store),
          .timeout = whole.timeout,
          .group_name = whole.group_name + "." + part,
          .device = whole.device};
}

Tensor like(const Tensor& t, int64_t n) {
  return Tensor::empty({n}, t.dtype());
}

char* bytes_of(Tensor& t) {
  return static_cast<char*>(t.raw_data());
}
const char* bytes_of(const Tensor& t) {
  return static_cast<const char*>(t.raw_data());
}

}  // namespace

HierarchicalBackend::HierarchicalBackend(const BackendContext& context)
    : rank_(context.rank), size_(context.size) {
  Store& store = *context.store;
  store.set("hierarchical/host/" + std::to_string(rank_), to_bytes(host_key()));
  std::map<std::string, int> host_of_key;
  std::vector<int> host(static_cast<size_t>(size_));
  std::vector<int> count;
  for (int r = 0; r < size_; ++r) {
    const std::string key =
        to_string(store.get("hierarchical/host/" + std::to_string(r), context.timeout));
    auto [it, added] = host_of_key.emplace(key, static_cast<int>(host_of_key.size()));
    if (added) count.push_back(0);
    host[static_cast<size_t>(r)] = it->second;
    ++count[static_cast<size_t>(it->second)];
  }
  hosts_ = static_cast<int>(count.size());
  local_size_ = count[static_cast<size_t>(host[static_cast<size_t>(rank_)])];
  if (hosts_ == 1) {  // one host: shared memory serves everything
    flat_ = std::make_unique<shm::ShmBackend>(sub_context(context, "flat", rank_, size_));
    return;
  }
  bool layered = local_size_ > 1;
  for (int r = 0; r < size_ && layered; ++r) {
    layered = count[static_cast<size_t>(host[static_cast<size_t>(r)])] == local_size_ &&
              host[static_cast<size_t>(r)] == r / local_size_;
  }
  std::unique_ptr<TransportBackend> flat =
      network_backend(sub_context(context, "flat", rank_, size_));
  if (layered) {
    const int my_host = rank_ / local_size_, local = rank_ % local_size_;
    intra_ = std::make_unique<shm::ShmBackend>(
        sub_context(context, "intra" + std::to_string(my_host), local, local_size_));
    std::vector<int> same_local_rank;
    for (int h = 0; h < hosts_; ++h)
      same_local_rank.push_back(h * local_size_ + local);
    inter_ = std::make_unique<algorithms::SubsetTransport>(*flat, std::move(same_local_rank));
  }
  flat_ = std::move(flat);
}

HierarchicalBackend::~HierarchicalBackend() = default;

void HierarchicalBackend::allreduce(const Tensor& input, Tensor& output, ReduceOp op,
                                    Deadline deadline) {
  const int64_t n = input.numel();
  if (!two_levels() || n == 0) return flat_->allreduce(input, output, op, deadline);
  const int64_t shard_count = (n + local_size_ - 1) / local_size_;
  // Where n is not a multiple of the local size, the levels work on a zero-padded copy;
  // otherwise they read `input` and write `output` themselves (the two copies of the whole
  // buffer were 43% of a 16 MiB allreduce with 2 ranks on each of two hosts). The shard is
  // separate, so output may be input.
  Tensor padded;
  if (n % local_size_ != 0) {
    padded = like(input, shard_count * local_size_);
    std::memcpy(padded.raw_data(), input.raw_data(), input.nbytes());
    std::memset(bytes_of(padded) + input.nbytes(), 0, padded.nbytes() - input.nbytes());
  }
  const Tensor& from = padded.defined() ? padded : input;
  Tensor& into = padded.defined() ? padded : output;
  Tensor shard = like(input, shard_count);
  const ReduceOp level = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  intra_->reduce_scatter(shard, from, level, deadline);
  algorithms::rank_ordered_allreduce(*inter_, shard.raw_data(), static_cast<size_t>(shard_count),
                                     input.dtype(), level, deadline);
  if (op == ReduceOp::Avg) {
    kernels::cpu::scale_inplace(input.dtype(), shard.raw_data(),
                                static_cast<size_t>(shard_count), 1.0 / size_);
  }
  intra_->all_gather(into, shard, deadline);
  if (&into != &output) std::memcpy(output.raw_data(), into.raw_data(), output.nbytes());
}

void HierarchicalBackend::reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op,
                                         Deadline deadline) {
  const int64_t c = output.numel();
  if (!two_levels() || c == 0) return flat_->reduce_scatter(output, input, op, deadline);
  const size_t slice = output.nbytes();
  // Local rank l's share: the slices of ranks h * L + l, host by host.
  Tensor arranged = like(input, input.numel());
  for (int l = 0; l < local_size_; ++l)
    for (int h = 0; h < hosts_; ++h)
      std::memcpy(bytes_of(arranged) + static_cast<size_t>(l * hosts_ + h) * slice,
                  bytes_of(input) + static_cast<size_t>(h * local_size_ + l) * slice, slice);
  Tensor mine = like(input, c * hosts_);
  const ReduceOp level = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  intra_->reduce_scatter(mine, arranged, level, deadline);
  algorithms::rank_ordered_reduce_scatter(*inter_, mine.raw_data(), output.raw_data(),
                                          static_cast<size_t>(c), input.dtype(), level, deadline);
  if (op == ReduceOp::Avg) {
    kernels::cpu::scale_inplace(output.dtype(), output.raw_data(),
                                static_cast<size_t>(c), 1.0 / size_);
  }
}

void HierarchicalBackend::all_gather(Tensor& output, const Tensor& input, Deadline deadline) {
  const int64_t c = input.numel();
  if (!two_levels() || c == 0) return flat_->all_gather(output, input, deadline);
  const size_t slice = input.nbytes();
  Tensor mine = like(input, c * hosts_);  // host h's rank of this local index, host by host
  algorithms::ring_all_gather(*inter_, input.raw_data(), mine.raw_data(), static_cast<size_t>(c),
                              input.dtype(), deadline);
  Tensor arranged = like(input, c * hosts_ * local_size_);
  intra_->all_gather(arranged, mine, deadline);
  for (int l = 0; l < local_size_; ++l)
    for (int h = 0; h < hosts_; ++h)
      std::memcpy(bytes_of(output) + static_cast<size_t>(h * local_size_ + l) * slice,
                  bytes_of(arranged) + static_cast<size_t>(l * hosts_ + h) * slice, slice);
}

void HierarchicalBackend::broadcast(Tensor& tensor, int root, Deadline deadline) {
  flat_->broadcast(tensor, root, deadline);
}

void HierarchicalBackend::reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) {
  flat_->reduce(tensor, root, op, deadline);
}

void HierarchicalBackend::all_to_all(Tensor& output, const Tensor& input, Deadline deadline) {
  flat_->all_to_all(output, input, deadline);
}

void HierarchicalBackend::send(const Tensor& tensor, int dst, int tag, Deadline deadline) {
  flat_->send(tensor, dst, tag, deadline);
}

void HierarchicalBackend::recv(Tensor& tensor, int src, int tag, Deadline deadline) {
  flat_->recv(tensor, src, tag, deadline);
}

void HierarchicalBackend::barrier(Deadline deadline) {
  flat_->barrier(deadline);
}

}  // namespace loom::comm::hierarchical
