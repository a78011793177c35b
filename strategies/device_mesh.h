#pragma once
// A device mesh: the ranks of a process group arranged in a grid with named dimensions
// (torch's DeviceMesh), e.g. {"dp": 2, "pp": 2, "tp": 2} over 8 ranks. Row-major: the last
// dimension varies fastest, so tensor-parallel partners (usually last) are neighbouring ranks,
// as Megatron and torch.distributed.device_mesh place them. Each dimension has its subgroup:
// the ranks that differ from this one in that coordinate only, made by ProcessGroup::split.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"

namespace loom::strategies {

class DeviceMesh {
 public:
  using Dims = std::vector<std::pair<std::string, int>>;
  // Collective over `group` (every rank, same dims): the sizes must multiply to the group's
  // size; dimensions of size 1 get a group of one.
  DeviceMesh(std::shared_ptr<comm::ProcessGroup> group, Dims dims);

  const Dims& dims() const { return dims_; }
  int size(const std::string& dim) const;
  // This rank's coordinate along `dim`.
  int coordinate(const std::string& dim) const;
  // The ranks that share every coordinate but `dim` with this one, ordered by their `dim`
  // coordinate (so the subgroup's rank is coordinate(dim)).
  const std::shared_ptr<comm::ProcessGroup>& group(const std::string& dim) const;
  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  // The rank (in the world group) at this rank's coordinates with `changes` applied.
  int rank_with(const std::map<std::string, int>& changes) const;
  // "dp 2 x pp 2 x tp 2"
  std::string describe() const;

  // The data-parallel size left when `world` ranks hold `model_parallel` = pp x tp ranks per
  // replica; throws loom::Error naming the world sizes that work when it does not divide.
  static int data_parallel_size(int world, int pp, int tp);

 private:
  size_t index_of(const std::string& dim) const;

  std::shared_ptr<comm::ProcessGroup> world_;
  Dims dims_;
  std::vector<int> coords_;
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_;
};

}  // namespace loom::strategies
