#include "data/token_source.h"

#include <glob.h>

#include <algorithm>
#include <memory>
#include <string_view>

#include "core/tags.h"

namespace loom::data {

namespace {

void check_token_range(int64_t start, int64_t count, int64_t size, std::string_view what) {
  if (start < 0 || count < 0 || start > size - count) {
    tag::kData.fail("tokens [", start, ", ", start, " + ", count, ") asked for; ", what, " hold ",
                    size);
  }
}

// The files `pattern` matches, in the byte order of their names. A pattern without glob
// characters is the one path itself, so that a missing file is reported by open(2).
std::vector<std::string> expand_pattern(const std::string& pattern) {
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  glob_t found{};
  const int status = ::glob(pattern.c_str(), 0, nullptr, &found);
  const std::unique_ptr<glob_t, void (*)(glob_t*)> release(&found, ::globfree);
  if (status == GLOB_NOMATCH) {
    tag::kData.fail("the pattern '", pattern, "' matches no file; expected token files (a path ",
                    "or a glob such as 'data/fineweb_train_*.bin')");
  }
  if (status != 0) {
    tag::kData.fail("the pattern '", pattern, "' could not be expanded (glob ",
                    status == GLOB_NOSPACE ? "ran out of memory" : "failed to read a directory",
                    ")");
  }
  std::vector<std::string> paths(found.gl_pathv, found.gl_pathv + found.gl_pathc);
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

void InMemoryTokens::copy(int64_t start, int64_t count, int64_t* out) const {
  check_token_range(start, count, size(), "the in-memory tokens");
  std::copy_n(tokens_.begin() + start, count, out);
}

std::string InMemoryTokens::describe(int64_t offset) const {
  return "offset " + std::to_string(offset) + " of the in-memory tokens";
}

ShardedTokens ShardedTokens::open(const std::string& pattern, std::optional<ShardFormat> format) {
  std::vector<TokenShard> shards;
  for (const std::string& path : expand_pattern(pattern))
    shards.push_back(TokenShard::open(path, format));
  return ShardedTokens(std::move(shards));
}

ShardedTokens::ShardedTokens(std::vector<TokenShard> shards) : shards_(std::move(shards)) {
  if (shards_.empty()) tag::kData.fail("no token files given; expected at least one");
  starts_.reserve(shards_.size() + 1);
  starts_.push_back(0);
  for (const TokenShard& shard : shards_) {
    if (shard.format() != shards_.front().format()) {
      tag::kData.fail(
          "token files of different formats in one data set: ", shards_.front().path().string(),
          " is ", name(shards_.front().format()), " but ", shard.path().string(), " is ",
          name(shard.format()), "; expected every file in one format");
    }
    starts_.push_back(starts_.back() + shard.size());
  }
}

size_t ShardedTokens::shard_of(int64_t offset) const {
  return static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                             starts_.begin() - 1);
}

void ShardedTokens::copy(int64_t start, int64_t count, int64_t* out) const {
  check_token_range(start, count, size(), "the token files");
  if (count == 0) return;
  for (size_t i = shard_of(start); count > 0; ++i) {  // across shard boundaries
    const int64_t local = start - starts_[i];
    const int64_t n = std::min(count, shards_[i].size() - local);
    shards_[i].copy(local, n, out);
    out += n;
    start += n;
    count -= n;
  }
}

std::string ShardedTokens::describe(int64_t offset) const {
  const size_t i = shard_of(offset);
  return "shard " + shards_[i].path().string() + ", token " + std::to_string(offset - starts_[i]);
}

}  // namespace loom::data
