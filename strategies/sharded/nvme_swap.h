#pragma once
// NVMe offload of the optimizer's working set (ZeRO-Infinity's offload_optimizer device
// "nvme"): the master shard and the optimizer state of each sub-group live in a SwapFile
// between steps, and the step pages them through host memory one sub-group after another,
// with at most `buffer_count` sub-groups in memory at once:
//
//   begin_step   read sub-groups 0 .. buffer_count-2 ahead
//   acquire(j)   wait for j's read; read ahead the next sub-group when a buffer is free
//   release(j)   write j's master and state back (asynchronously); a later acquire waits
//                for the oldest write only when it needs its buffer
//   end_step     wait for every write; nothing stays in memory
//
// So reads of the next sub-group and writes of the previous one overlap the update of the
// current one (with buffer_count >= 3; 2 overlaps reads only, 1 nothing). Sub-groups are
// acquired in increasing order within a step (the optimizer's parameter order).
//
// Threading: the training thread only (the optimizer's step hooks).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strategies/sharded/swap_file.h"
#include "tensor/tensor.h"

namespace loom::strategies::sharded {

class OptimizerSwap {
 public:
  // Opens the swap file under `directory`, reserving `reserve_bytes` (SwapFile's errors).
  OptimizerSwap(const std::string& directory, int buffer_count, size_t reserve_bytes);
  ~OptimizerSwap();

  // Takes `master` (a contiguous host tensor with its own storage) into the file: writes its
  // contents and releases its memory. Returns its sub-group id (0, 1, ... in call order).
  size_t add(Tensor master);

  void begin_step();
  // Sub-group `id`'s master and state are in memory when this returns.
  void acquire(size_t id);
  // The optimizer is done with sub-group `id`; `state` are its state tensors (the first
  // release of a sub-group names them; tensors that replaced them since, as
  // Optimizer::load_state_dict makes, take their place).
  void release(size_t id, std::vector<Tensor> state);
  void end_step();
  // Outside a step: every sub-group's master and state in memory (a checkpoint's snapshot
  // reads them), then out of it again without writing (nothing changed).
  void read_all();
  void drop_all();
  // Outside a step: each sub-group in turn into memory, fill(id) changes its master (loading
  // a checkpoint's weights), and back to the file.
  void rewrite_masters(const std::function<void(size_t id)>& fill);

  const SwapFile& file() const { return file_; }
  // The same file, for other tensors the engine keeps there (parameter shards).
  SwapFile& file() { return file_; }
  size_t sub_group_count() const { return groups_.size(); }

 private:
  enum class Where { File, Reading, Resident, Writing };
  struct SubGroup {
    Tensor master;
    std::vector<Tensor> state;
    std::vector<uint64_t> offsets;  // master's, then each state tensor's
    Where where = Where::File;
    std::vector<SwapFile::Ticket> io;
  };
  std::vector<Tensor> tensors_of(const SubGroup& g) const;
  size_t in_memory() const;  // sub-groups reading, resident or writing
  void start_read(size_t id);
  void finish_io(size_t id);  // waits for its transfers; a finished write releases memory
  void make_room();           // finishes the oldest write when buffer_count are in memory

  SwapFile file_;
  int buffer_count_;
  std::vector<SubGroup> groups_;
  std::vector<size_t> writes_;  // sub-groups being written, oldest first
};

}  // namespace loom::strategies::sharded
