#include "strategies/distributed_sampler.h"

#include <numeric>
#include <utility>

#include "core/error.h"
#include "core/tags.h"
#include "tensor/random.h"

namespace loom::strategies {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       const DistributedSamplerOptions& options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  if (dataset_size < 0) {
    tag::kStrategiesSampler.fail("dataset_size must be >= 0, got ", dataset_size);
  }
  if (num_replicas < 1) {
    tag::kStrategiesSampler.fail("num_replicas must be >= 1, got ", num_replicas);
  }
  if (rank < 0 || rank >= num_replicas) {
    tag::kStrategiesSampler.fail("rank must be in [0, ", num_replicas - 1, "], got ", rank,
                                 " (num_replicas ", num_replicas, ")");
  }
  // torch: ceil((N - R) / R) when drop_last and R does not divide N, which is floor(N / R)
  // (0 when N < R); otherwise ceil(N / R).
  num_samples_ = options_.drop_last ? dataset_size_ / num_replicas_
                                    : (dataset_size_ + num_replicas_ - 1) / num_replicas_;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order(static_cast<size_t>(dataset_size_));
  std::iota(order.begin(), order.end(), int64_t{0});
  if (options_.shuffle) {
    // Fisher-Yates over Loom's generator (see the header: not torch.randperm's stream).
    Generator gen(options_.seed + static_cast<uint64_t>(epoch_));
    for (int64_t i = dataset_size_ - 1; i > 0; --i) {
      auto j = static_cast<int64_t>(gen.uniform() * static_cast<double>(i + 1));
      if (j > i) j = i;  // guards rounding of uniform() * (i + 1) up to i + 1
      std::swap(order[i], order[j]);
    }
  }
  // Global position p of the padded (or cut) order holds order[p % N]: torch's
  // `indices += indices[:padding]`, repeated when the padding exceeds N.
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t p = rank_; p < total_size(); p += num_replicas_) {
    mine.push_back(order[p % dataset_size_]);
  }
  return mine;
}

}  // namespace loom::strategies
