#pragma once
// Backend: how one transport moves bytes for one process group. A backend implements every
// collective (all pure virtual: a backend that lacks one does not compile). The process
// group validates arguments, numbers operations and runs them one at a time, in issue
// order, on its progress thread; a backend method runs the operation to completion (or
// throws loom::CommError) before returning, and never waits past `deadline`.
// Tensors reaching a backend are contiguous, on the backend's device(), and checked for
// matching dtypes and sizes. A host backend (device() is the CPU) is also given CUDA tensors:
// the process group stages them through pinned host memory (Note [Staging CUDA tensors] in
// comm/cuda/staging_backend.h).

#include <memory>
#include <optional>
#include <string>

#include "comm/error.h"
#include "comm/reduce_op.h"
#include "comm/store/store.h"
#include "core/tags.h"
#include "tensor/tensor.h"

namespace loom::comm {

// Everything a backend needs to set itself up.
struct BackendContext {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;  // private to this group (prefixed)
  Duration timeout = kDefaultTimeout;
  std::string group_name;  // unique per group, e.g. "default" or "default.split3.c1"
  // The device of the group's tensors when its creator named one (GroupOptions::device). A
  // device backend binds to it (nccl: absent means the calling thread's current GPU); host
  // backends ignore it.
  std::optional<Device> device = std::nullopt;
  std::shared_ptr<const std::vector<int>> world_ranks = nullptr;  // GroupOptions::world_ranks
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // "shm"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the tensors it reads and writes live: the CPU for host backends (the default), one
  // GPU for a device backend (nccl). Tensors on any other device are refused by the group.
  virtual Device device() const { return Device::cpu(); }

  // output = reduction of every rank's input; input and output may be the same tensor.
  virtual void allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) = 0;
  virtual void broadcast(Tensor& tensor, int root, Deadline deadline) = 0;
  // The result lands in `tensor` on `root`; other ranks' tensors are left unchanged.
  virtual void reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) = 0;
  // output ([size * n]) = concatenation of every rank's input ([n]) in rank order.
  virtual void all_gather(Tensor& output, const Tensor& input, Deadline deadline) = 0;
  // output ([n]) = this rank's slice of the reduction of every rank's input ([size * n]).
  virtual void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op,
                              Deadline deadline) = 0;
  // Slice j of this rank's input ([size * n]) goes to rank j, which stores it as its
  // output's slice i (i = this rank).
  virtual void all_to_all(Tensor& output, const Tensor& input, Deadline deadline) = 0;
  virtual void send(const Tensor& tensor, int dst, int tag, Deadline deadline) = 0;
  virtual void recv(Tensor& tensor, int src, int tag, Deadline deadline) = 0;
  virtual void barrier(Deadline deadline) = 0;

  // Posted allreduces (Note [Posted allreduces] in comm/process_group.cpp), optional. A backend
  // that can split an allreduce of at most postable_allreduce_bytes() in two says so here:
  // post_allreduce() sends this rank's input without waiting for the peers, and
  // finish_allreduce() later writes the result of the oldest posted allreduce into `output`
  // (same op, same size). The group calls them in issue order, one thread at a time, with at
  // most max_posted() posted and not finished, and finishes every posted one before any other
  // operation. The defaults post nothing.
  virtual size_t postable_allreduce_bytes() const { return 0; }
  virtual size_t max_posted() const { return 0; }
  virtual void post_allreduce(const Tensor& /*input*/, ReduceOp /*op*/, Deadline /*deadline*/) {
    tag::kComm.fail(name(), " backend: post_allreduce is not supported");
  }
  virtual void finish_allreduce(Tensor& /*output*/, ReduceOp /*op*/, Deadline /*deadline*/) {
    tag::kComm.fail(name(), " backend: finish_allreduce is not supported");
  }

  // Simulated operations. A backend whose operations never wait for other processes (the sim
  // backend, comm/sim/: its peers do not exist) returns true from runs_at_issue(): the group
  // runs each of its operations on the issuing thread at issue, whatever async_op says, and
  // times its Work (started_at, completed_at) with last_times(), the simulated interval of the
  // operation that just ran, instead of the clock.
  virtual bool runs_at_issue() const { return false; }
  struct Times {
    Clock::time_point started, completed;
  };
  virtual Times last_times() const { return {}; }

  // Subgroups. A backend that splits natively (nccl: ncclCommSplit) returns true from
  // splits_natively(); ProcessGroup::split then calls split() like a collective: on the
  // progress thread, in issue order, on every rank of this group, with color < 0 on the
  // ranks that join no subgroup (they get nullptr). `key` is the rank's position in its
  // subgroup, which `child` describes. Otherwise (the default) the subgroup gets a fresh
  // backend from the registry.
  virtual bool splits_natively() const { return false; }
  // Throws loom::Error saying why when this backend cannot make subgroups at all (the sim
  // backend); ProcessGroup::split asks first, before any rank waits for the others.
  virtual void check_can_split() const {}
  virtual std::unique_ptr<Backend> split(int /*color*/, int /*key*/,
                                         const BackendContext& /*child*/, Deadline /*deadline*/) {
    return nullptr;
  }
};

}  // namespace loom::comm
