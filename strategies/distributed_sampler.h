#pragma once
// DistributedSampler: which dataset indices each rank reads in an epoch, with the semantics
// of torch.utils.data.DistributedSampler.
//
//   DistributedSampler sampler(dataset.size(), pg->size(), pg->rank());
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);  // same epoch on every rank, or ranks read overlapping data
//     for (int64_t i : sampler.indices()) ...
//   }
//
// Every rank builds the same global order (range(N), or a permutation seeded by seed + epoch),
// cuts or pads it to a multiple of the world size R, and takes every R-th index starting at
// its rank. Without drop_last the order is padded to ceil(N / R) * R by repeating it from the
// start (cyclically when the padding exceeds N), so some indices appear twice in an epoch;
// with drop_last it is cut to floor(N / R) * R. An empty dataset gives empty index lists.
//
// Difference from torch: with shuffle the permutation is Loom's own (a Fisher-Yates shuffle
// driven by loom::Generator(seed + epoch)), not torch.randperm's, whose stream cannot be
// reproduced in C++. It is identical on every rank, platform and compiler; everything else
// (padding, dropping, striding, num_samples) matches torch index for index.
//
// Not thread-safe; a sampler is a small value owned by one data loader.

#include <cstdint>
#include <vector>

namespace loom::strategies {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;
};

class DistributedSampler {
 public:
  // Throws loom::Error when dataset_size < 0, num_replicas < 1 or rank is outside
  // [0, num_replicas).
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                     const DistributedSamplerOptions& options = {});
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle,
                     uint64_t seed = 0, bool drop_last = false)
      : DistributedSampler(dataset_size, num_replicas, rank,
                           {.shuffle = shuffle, .seed = seed, .drop_last = drop_last}) {}

  // Selects the permutation of the following indices() calls (only matters with shuffle).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch, num_samples() of them.
  std::vector<int64_t> indices() const;

  // Indices per rank: ceil(N / R), or floor(N / R) with drop_last.
  int64_t num_samples() const { return num_samples_; }
  // Indices over all ranks: num_samples() * num_replicas.
  int64_t total_size() const { return num_samples_ * num_replicas_; }

  int64_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

 private:
  int64_t dataset_size_;
  int num_replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

}  // namespace loom::strategies
