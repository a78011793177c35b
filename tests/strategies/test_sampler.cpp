// DistributedSampler: exact index lists against torch.utils.data.DistributedSampler
// (shuffle=False, values printed by torch 1.13), padding and dropping, and the properties of
// the shuffled order (Loom's own permutation, so checked by property, not by value).

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/error.h"
#include "strategies/distributed_sampler.h"

namespace loom::strategies {
namespace {

using Lists = std::vector<std::vector<int64_t>>;

Lists all_ranks(int64_t n, int r, bool shuffle, bool drop_last, uint64_t seed = 0,
                int64_t epoch = 0) {
  Lists out;
  for (int rank = 0; rank < r; ++rank) {
    DistributedSampler s(n, r, rank, shuffle, seed, drop_last);
    s.set_epoch(epoch);
    std::vector<int64_t> idx = s.indices();
    EXPECT_EQ(static_cast<int64_t>(idx.size()), s.num_samples()) << "rank " << rank;
    out.push_back(idx);
  }
  return out;
}

// The global order the ranks were cut from: position p is rank p % R's (p / R)-th index.
std::vector<int64_t> interleave(const Lists& lists) {
  std::vector<int64_t> global;
  size_t per_rank = lists.empty() ? 0 : lists[0].size();
  for (size_t i = 0; i < per_rank; ++i) {
    for (const auto& l : lists)
      global.push_back(l[i]);
  }
  return global;
}

TEST(DistributedSampler, MatchesTorchWithoutShuffle) {
  EXPECT_EQ(all_ranks(10, 3, false, false), (Lists{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}));
  EXPECT_EQ(all_ranks(10, 3, false, true), (Lists{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(all_ranks(12, 4, false, false), (Lists{{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}));
  EXPECT_EQ(all_ranks(12, 4, false, true), (Lists{{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}}));
  EXPECT_EQ(all_ranks(7, 1, false, false), (Lists{{0, 1, 2, 3, 4, 5, 6}}));
}

TEST(DistributedSampler, PadsCyclicallyWhenDatasetSmallerThanWorld) {
  EXPECT_EQ(all_ranks(2, 5, false, false), (Lists{{0}, {1}, {0}, {1}, {0}}));
  EXPECT_EQ(all_ranks(3, 8, false, false), (Lists{{0}, {1}, {2}, {0}, {1}, {2}, {0}, {1}}));
  EXPECT_EQ(all_ranks(2, 5, false, true), (Lists{{}, {}, {}, {}, {}}));
}

TEST(DistributedSampler, EmptyDatasetGivesEmptyLists) {
  EXPECT_EQ(all_ranks(0, 3, false, false), (Lists{{}, {}, {}}));
  EXPECT_EQ(all_ranks(0, 3, true, true), (Lists{{}, {}, {}}));
  EXPECT_EQ(DistributedSampler(0, 3, 1).num_samples(), 0);
}

TEST(DistributedSampler, NumSamples) {
  EXPECT_EQ(DistributedSampler(10, 3, 0).num_samples(), 4);
  EXPECT_EQ(DistributedSampler(10, 3, 2, false, 0, true).num_samples(), 3);
  EXPECT_EQ(DistributedSampler(10, 3, 2, false, 0, true).total_size(), 9);
  EXPECT_EQ(DistributedSampler(12, 4, 3).num_samples(), 3);
  EXPECT_EQ(DistributedSampler(2, 5, 4).num_samples(), 1);
  EXPECT_EQ(DistributedSampler(2, 5, 4, {.drop_last = true}).num_samples(), 0);
  EXPECT_EQ(DistributedSampler(1001, 8, 7).num_samples(), 126);
  EXPECT_EQ(DistributedSampler(1001, 8, 7, {.drop_last = true}).num_samples(), 125);
}

TEST(DistributedSampler, ShuffledRanksPartitionTheDataset) {
  for (int r : {1, 2, 3, 4, 7}) {
    int64_t n = 84;  // divisible by every r: no padding, no dropping
    std::vector<int64_t> all;
    for (const auto& l : all_ranks(n, r, true, false, 5, 2))
      all.insert(all.end(), l.begin(), l.end());
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(n);
    for (int64_t i = 0; i < n; ++i)
      expected[i] = i;
    EXPECT_EQ(all, expected) << "r = " << r;
  }
}

TEST(DistributedSampler, ShuffledPaddingRepeatsTheStartOfThePermutation) {
  for (auto [n, r] : {std::pair<int64_t, int>{10, 3}, {2, 5}, {3, 8}, {100, 7}}) {
    std::vector<int64_t> global = interleave(all_ranks(n, r, true, false, 11, 3));
    ASSERT_EQ(static_cast<int64_t>(global.size()), (n + r - 1) / r * r);
    std::vector<int64_t> head(global.begin(), global.begin() + n);
    std::sort(head.begin(), head.end());
    for (int64_t i = 0; i < n; ++i)
      EXPECT_EQ(head[i], i) << "n = " << n << ", r = " << r;
    for (size_t p = n; p < global.size(); ++p)
      EXPECT_EQ(global[p], global[p - n]) << "n = " << n << ", r = " << r << ", p = " << p;
  }
}

TEST(DistributedSampler, ShuffledDropLastKeepsAPrefixOfThePermutation) {
  // The cut happens after shuffling (as torch), so the kept indices are distinct, and the
  // dropped tail is the rest of the same permutation.
  Lists kept = all_ranks(10, 3, true, true, 4, 1);
  Lists padded = all_ranks(10, 3, true, false, 4, 1);
  std::vector<int64_t> global = interleave(kept);
  EXPECT_EQ(global.size(), 9u);
  EXPECT_EQ(std::set<int64_t>(global.begin(), global.end()).size(), 9u);
  std::vector<int64_t> full = interleave(padded);
  EXPECT_TRUE(std::equal(global.begin(), global.end(), full.begin()));
}

TEST(DistributedSampler, EpochAndSeedSelectTheOrder) {
  int64_t n = 50;
  DistributedSampler a(n, 2, 0, true, 7);
  DistributedSampler b(n, 2, 0, true, 7);
  std::vector<int64_t> epoch0 = a.indices();
  EXPECT_EQ(epoch0, b.indices());  // same seed and epoch: same order
  a.set_epoch(1);
  EXPECT_EQ(a.epoch(), 1);
  std::vector<int64_t> epoch1 = a.indices();
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(epoch1, a.indices());  // indices() does not advance anything
  b.set_epoch(1);
  EXPECT_EQ(epoch1, b.indices());
  EXPECT_NE(epoch0, DistributedSampler(n, 2, 0, true, 8).indices());  // other seed
  // Shuffled at all: not the identity order.
  EXPECT_NE(epoch0, DistributedSampler(n, 2, 0, false).indices());
  // Without shuffle the epoch does not matter.
  DistributedSampler c(n, 2, 1, false);
  std::vector<int64_t> before = c.indices();
  c.set_epoch(9);
  EXPECT_EQ(before, c.indices());
}

TEST(DistributedSampler, RejectsBadArguments) {
  EXPECT_THROW(DistributedSampler(10, 3, 3), Error);
  EXPECT_THROW(DistributedSampler(10, 3, -1), Error);
  EXPECT_THROW(DistributedSampler(10, 0, 0), Error);
  EXPECT_THROW(DistributedSampler(-1, 2, 0), Error);
  try {
    DistributedSampler(10, 3, 5);
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("got 5"), std::string::npos) << what;
    EXPECT_NE(what.find("num_replicas 3"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace loom::strategies
