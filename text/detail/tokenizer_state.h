#pragma once
// What a Tokenizer holds: built by text/tokenizer_file.cpp, used by text/tokenizer.cpp.
// Internal to text/.

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/added_tokens.h"
#include "text/bpe.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"

namespace loom::text {

struct Tokenizer::State {
  std::string origin;  // the file, for messages
  SplitPattern pattern = SplitPattern::kGpt2;
  Bpe bpe;
  AddedTokens added;
  uint32_t vocab_size = 0;
  // The bytes ByteLevel's decoder gives for each id: decode_bytes[offsets[id], offsets[id + 1]).
  std::vector<uint32_t> decode_offsets;
  std::string decode_bytes;
  std::vector<uint8_t> special;  // per id: an added token marked special
  // The model's tokens whose text is not in the byte-level alphabet (BPE never makes them;
  // token_id still finds them), by text.
  std::unordered_map<std::string, uint32_t> other_tokens;
};

}  // namespace loom::text
