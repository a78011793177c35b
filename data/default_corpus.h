#pragma once
// The embedded default training text: generated on the fly (no download, nothing shipped),
// deterministic for a given size, and structured enough that a small GPT's loss falls well
// below the uniform log(256) within a few hundred steps.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace loom::data {

// About `bytes` bytes of English-like sentences built from a small grammar.
std::vector<uint8_t> default_corpus(size_t bytes = 1 << 20);

}  // namespace loom::data
