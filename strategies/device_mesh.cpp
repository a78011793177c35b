#include "strategies/device_mesh.h"

#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies {

DeviceMesh::DeviceMesh(std::shared_ptr<comm::ProcessGroup> group, Dims dims)
    : world_(std::move(group)), dims_(std::move(dims)) {
  if (!world_) tag::kMesh.fail("DeviceMesh needs a process group");
  int product = 1;
  for (const auto& [name, size] : dims_) {
    if (size < 1) tag::kMesh.fail("dimension '", name, "' has size ", size, "; sizes are >= 1");
    product *= size;
  }
  if (product != world_->size())
    tag::kMesh.fail(describe(), " holds ", product, " ranks, but the group has ", world_->size());
  // Row-major coordinates of this rank.
  coords_.assign(dims_.size(), 0);
  int rest = world_->rank();
  for (size_t d = dims_.size(); d-- > 0;) {
    coords_[d] = rest % dims_[d].second;
    rest /= dims_[d].second;
  }
  for (size_t d = 0; d < dims_.size(); ++d) {
    // Color: the linear index of the other coordinates; key: the coordinate along d. Every
    // rank's, from its row-major coordinates (a simulated group needs them all).
    groups_.push_back(world_->split_by([&](int rank) {
      std::vector<int> coords(dims_.size());
      for (size_t e = dims_.size(); e-- > 0;) {
        coords[e] = rank % dims_[e].second;
        rank /= dims_[e].second;
      }
      int color = 0;
      for (size_t e = 0; e < dims_.size(); ++e)
        if (e != d) color = color * dims_[e].second + coords[e];
      return std::pair{color, coords[d]};
    }));
  }
}

size_t DeviceMesh::index_of(const std::string& dim) const {
  for (size_t d = 0; d < dims_.size(); ++d)
    if (dims_[d].first == dim) return d;
  tag::kMesh.fail(describe(), " has no dimension '", dim, "'");
}

int DeviceMesh::size(const std::string& dim) const {
  return dims_[index_of(dim)].second;
}

int DeviceMesh::coordinate(const std::string& dim) const {
  return coords_[index_of(dim)];
}

const std::shared_ptr<comm::ProcessGroup>& DeviceMesh::group(const std::string& dim) const {
  return groups_[index_of(dim)];
}

int DeviceMesh::rank_with(const std::map<std::string, int>& changes) const {
  std::vector<int> coords = coords_;
  for (const auto& [dim, value] : changes) {
    const size_t d = index_of(dim);
    if (value < 0 || value >= dims_[d].second)
      tag::kMesh.fail("coordinate ", value, " along '", dim, "' of ", describe());
    coords[d] = value;
  }
  int rank = 0;
  for (size_t d = 0; d < dims_.size(); ++d)
    rank = rank * dims_[d].second + coords[d];
  return rank;
}

std::string DeviceMesh::describe() const {
  std::string text;
  for (const auto& [name, size] : dims_)
    text += (text.empty() ? "" : " x ") + name + " " + std::to_string(size);
  return text;
}

int DeviceMesh::data_parallel_size(int world, int pp, int tp) {
  if (pp < 1 || tp < 1) tag::kMesh.fail("--pp and --tp are >= 1, got ", pp, " and ", tp);
  const int per_replica = pp * tp;
  if (world % per_replica != 0) {
    tag::kMesh.fail(world, " rank(s) do not split into replicas of pp ", pp, " x tp ", tp, " = ",
                    per_replica, " ranks; world sizes that work are multiples of ", per_replica,
                    " (", per_replica, ", ", 2 * per_replica, ", ", 3 * per_replica, ", ...)");
  }
  return world / per_replica;
}

}  // namespace loom::strategies
