// Reading a tokenizer.json: every field the encoding depends on is checked against what
// text/ implements, and anything else is refused with one line naming the file and the field
// (the fields' meanings are tokenizers' own: tokenizer/serialization.rs, models/bpe/,
// pre_tokenizers/, added_vocabulary.rs).

#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_map>

#include "core/tags.h"
#include "text/byte_level.h"
#include "text/detail/tokenizer_state.h"
#include "text/tokenizer.h"

namespace loom::text {

namespace {

using json = nlohmann::json;

constexpr std::string_view kExpectedPreTokenizer =
    "ByteLevel with use_regex true (GPT-2), or Sequence [Split with GPT-2's or Llama 3's "
    "regex, behavior Isolated, invert false; ByteLevel with use_regex false] (Llama 3)";

// A JSON value in a message: short values whole, long ones cut (on a character boundary).
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() <= 80) return text;
  size_t cut = 77;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  return text.substr(0, cut) + "...";
}

class FileReader {
 public:
  explicit FileReader(const std::string& origin) : origin_(origin) {}

  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    tag::kTokenizer.fail(origin_, ": ", parts...);
  }

  // object[key], or nullptr when absent.
  static const json* find(const json& object, std::string_view key) {
    const auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }
  static bool null_or_absent(const json& object, std::string_view key) {
    const json* value = find(object, key);
    return value == nullptr || value->is_null();
  }

  const json& object_at(const json& object, std::string_view key, std::string_view path) const {
    const json* value = find(object, key);
    if (value == nullptr) fail(path, " is missing; expected an object");
    if (!value->is_object()) fail(path, " is ", shown(*value), "; expected an object");
    return *value;
  }

  std::string string_at(const json& object, std::string_view key, std::string_view path) const {
    const json* value = find(object, key);
    if (value == nullptr) fail(path, " is missing; expected a string");
    if (!value->is_string()) fail(path, " is ", shown(*value), "; expected a string");
    return value->get<std::string>();
  }

  bool bool_at(const json& object, std::string_view key, std::string_view path,
               std::optional<bool> fallback) const {
    const json* value = find(object, key);
    if (value == nullptr) {
      if (!fallback) fail(path, " is missing; expected true or false");
      return *fallback;
    }
    if (!value->is_boolean()) fail(path, " is ", shown(*value), "; expected true or false");
    return value->get<bool>();
  }

  uint32_t id_at(const json& object, std::string_view key, std::string_view path) const {
    const json* value = find(object, key);
    if (value == nullptr) fail(path, " is missing; expected a token id");
    return id_of(*value, path);
  }

  uint32_t id_of(const json& value, std::string_view path) const {
    // Below 2^32 - 1, which text/ keeps for "no token".
    if (!value.is_number_unsigned() ||
        value.get<uint64_t>() >= std::numeric_limits<uint32_t>::max()) {
      fail(path, " is ", shown(value), "; expected a token id (an integer from 0 to 2^32 - 2)");
    }
    return static_cast<uint32_t>(value.get<uint64_t>());
  }

  // A field that must be null (or absent) for text/ to give tokenizers' results.
  void require_null(const json& object, std::string_view key, std::string_view path,
                    std::string_view expected) const {
    if (!null_or_absent(object, key))
      fail(path, " is ", shown(object[std::string(key)]), "; expected ", expected);
  }

  // A ByteLevel pre-tokenizer: returns its use_regex.
  bool byte_level_pre_tokenizer(const json& pre, std::string_view path) const {
    if (bool_at(pre, "add_prefix_space", std::string(path) + ".add_prefix_space", std::nullopt))
      fail(path, ".add_prefix_space is true; expected false (GPT-2's and Llama 3's setting)");
    // use_regex is true where absent, as in tokenizers.
    return bool_at(pre, "use_regex", std::string(path) + ".use_regex", true);
  }

  SplitPattern pre_tokenizer(const json& root) const {
    const json* pre = find(root, "pre_tokenizer");
    if (pre == nullptr || pre->is_null())
      fail("pre_tokenizer is null; expected ", kExpectedPreTokenizer);
    if (!pre->is_object())
      fail("pre_tokenizer is ", shown(*pre), "; expected ", kExpectedPreTokenizer);
    const std::string type = string_at(*pre, "type", "pre_tokenizer.type");
    if (type == "ByteLevel") {
      if (!byte_level_pre_tokenizer(*pre, "pre_tokenizer"))
        fail("pre_tokenizer is ByteLevel with use_regex false (no split at all); expected ",
             kExpectedPreTokenizer);
      return SplitPattern::kGpt2;
    }
    if (type != "Sequence") fail("pre_tokenizer is ", type, "; expected ", kExpectedPreTokenizer);
    const json* steps = find(*pre, "pretokenizers");
    if (steps == nullptr || !steps->is_array() || steps->size() != 2) {
      fail("pre_tokenizer.pretokenizers is ", steps == nullptr ? "missing" : shown(*steps),
           "; expected two steps: ", kExpectedPreTokenizer);
    }
    const json& split = (*steps)[0];
    const json& byte_level = (*steps)[1];
    if (!split.is_object() || split.value("type", "") != "Split")
      fail("pre_tokenizer.pretokenizers[0] is ", shown(split),
           "; expected a Split: ", kExpectedPreTokenizer);
    if (!byte_level.is_object() || byte_level.value("type", "") != "ByteLevel") {
      fail("pre_tokenizer.pretokenizers[1] is ", shown(byte_level),
           "; expected a ByteLevel: ", kExpectedPreTokenizer);
    }
    const json& pattern = object_at(split, "pattern", "pre_tokenizer.pretokenizers[0].pattern");
    if (find(pattern, "Regex") == nullptr) {
      fail("pre_tokenizer.pretokenizers[0].pattern is ", shown(pattern),
           "; expected {\"Regex\": GPT-2's or Llama 3's pattern}");
    }
    const std::string regex =
        string_at(pattern, "Regex", "pre_tokenizer.pretokenizers[0].pattern.Regex");
    const std::optional<SplitPattern> known = split_pattern_of(regex);
    if (!known) {
      fail("pre_tokenizer.pretokenizers[0].pattern.Regex is ", shown(json(regex)),
           "; expected GPT-2's or Llama 3's split pattern, character for character "
           "(text/pre_tokenizer.h)");
    }
    const std::string behavior =
        string_at(split, "behavior", "pre_tokenizer.pretokenizers[0].behavior");
    if (behavior != "Isolated")
      fail("pre_tokenizer.pretokenizers[0].behavior is ", behavior, "; expected Isolated");
    if (bool_at(split, "invert", "pre_tokenizer.pretokenizers[0].invert", false))
      fail("pre_tokenizer.pretokenizers[0].invert is true; expected false");
    if (byte_level_pre_tokenizer(byte_level, "pre_tokenizer.pretokenizers[1]")) {
      fail(
          "pre_tokenizer.pretokenizers[1].use_regex is true (a second split after the Split); "
          "expected false");
    }
    return *known;
  }

 private:
  const std::string& origin_;
};

// The model's vocabulary: the text of each id, and the id of each text.
struct Vocabulary {
  std::vector<std::string> texts;  // by id, dense
  std::unordered_map<std::string_view, uint32_t> ids;
};

Vocabulary read_vocabulary(const FileReader& reader, const json& model) {
  const json& vocab = reader.object_at(model, "vocab", "model.vocab");
  Vocabulary v;
  v.texts.resize(vocab.size());
  std::vector<bool> seen(vocab.size());
  for (const auto& [text, value] : vocab.items()) {
    const uint32_t id = reader.id_of(value, "model.vocab[" + shown(json(text)) + "]");
    if (id >= vocab.size()) {
      reader.fail("model.vocab[", shown(json(text)), "] is ", id, "; expected the ", vocab.size(),
                  " ids of the vocabulary to be 0 to ", vocab.size() - 1);
    }
    if (seen[id]) {
      reader.fail("model.vocab gives id ", id, " to both ", shown(json(v.texts[id])), " and ",
                  shown(json(text)), "; expected each id once");
    }
    seen[id] = true;
    v.texts[id] = text;
  }
  for (uint32_t id = 0; id < v.texts.size(); ++id)
    v.ids.emplace(v.texts[id], id);
  return v;
}

std::vector<MergeRule> read_merges(const FileReader& reader, const json& model,
                                   const Vocabulary& vocab) {
  const json* merges = FileReader::find(model, "merges");
  if (merges == nullptr || !merges->is_array()) {
    reader.fail("model.merges is ", merges == nullptr ? "missing" : shown(*merges),
                "; expected an array of merges, each \"a b\" or [\"a\", \"b\"]");
  }
  const bool as_strings = !merges->empty() && (*merges)[0].is_string();
  std::vector<MergeRule> rules;
  rules.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& merge = (*merges)[i];
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    std::string left;
    std::string right;
    if (as_strings) {
      if (!merge.is_string()) {
        reader.fail(path, " is ", shown(merge),
                    "; expected a string like model.merges[0] (\"a b\"), ",
                    "not a mix of strings and pairs");
      }
      const std::string& line = merge.get_ref<const std::string&>();
      if (line.starts_with("#version"))
        continue;  // a merges.txt header, skipped as tokenizers does
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        reader.fail(path, " is ", shown(merge), "; expected two tokens separated by one space");
      left = line.substr(0, space);
      right = line.substr(space + 1);
    } else {
      if (!merge.is_array() || merge.size() != 2 || !merge[0].is_string() ||
          !merge[1].is_string()) {
        reader.fail(path, " is ", shown(merge), "; expected a pair of token strings [\"a\", \"b\"]",
                    i > 0 ? " like model.merges[0]" : "");
      }
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    const auto find = [&](const std::string& text, std::string_view what) {
      const auto it = vocab.ids.find(text);
      if (it == vocab.ids.end())
        reader.fail(path, " (", shown(merge), "): ", what, shown(json(text)),
                    " is not in model.vocab");
      return it->second;
    };
    const uint32_t a = find(left, "");
    const uint32_t b = find(right, "");
    const uint32_t result = find(left + right, "the merged token ");
    rules.push_back({a, b, result});
  }
  return rules;
}

struct Model {
  Vocabulary vocab;
  std::vector<MergeRule> merges;
  bool ignore_merges = false;
  std::optional<std::string> unk_token;
};

Model read_model(const FileReader& reader, const json& root) {
  const json& model = reader.object_at(root, "model", "model");
  const std::string type = reader.string_at(model, "type", "model.type");
  if (type != "BPE")
    reader.fail("model.type is ", type,
                "; expected BPE (byte-level BPE is the only model supported)");
  reader.require_null(model, "dropout", "model.dropout", "null (BPE dropout is random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* value = FileReader::find(model, key);
    if (value != nullptr && !value->is_null() &&
        !(value->is_string() && value->get_ref<const std::string&>().empty()))
      reader.fail("model.", key, " is ", shown(*value),
                  "; expected null or \"\" (byte-level BPE uses none)");
  }
  if (reader.bool_at(model, "byte_fallback", "model.byte_fallback", false))
    reader.fail(
        "model.byte_fallback is true; expected false (byte-level BPE has a token for every byte)");
  Model m;
  m.ignore_merges = reader.bool_at(model, "ignore_merges", "model.ignore_merges", false);
  if (!FileReader::null_or_absent(model, "unk_token"))
    m.unk_token = reader.string_at(model, "unk_token", "model.unk_token");
  m.vocab = read_vocabulary(reader, model);
  m.merges = read_merges(reader, model, m.vocab);
  return m;
}

}  // namespace

Tokenizer Tokenizer::from_json(std::string_view text, const std::string& origin) {
  const FileReader reader(origin);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    reader.fail("not valid JSON (", e.what(), "); expected a Hugging Face tokenizer.json");
  }
  if (!root.is_object())
    reader.fail("the top level is ", shown(root),
                "; expected a JSON object (a Hugging Face tokenizer.json)");
  if (const json* version = FileReader::find(root, "version");
      version != nullptr && *version != "1.0")
    reader.fail("version is ", shown(*version), "; expected \"1.0\"");
  reader.require_null(root, "truncation", "truncation", "null (encode never truncates)");
  reader.require_null(root, "padding", "padding", "null (encode never pads)");
  reader.require_null(root, "normalizer", "normalizer", "null (no normalizer is supported)");
  const SplitPattern pattern = reader.pre_tokenizer(root);
  const json& decoder = reader.object_at(root, "decoder", "decoder");
  if (const std::string type = reader.string_at(decoder, "type", "decoder.type");
      type != "ByteLevel")
    reader.fail("decoder.type is ", type, "; expected ByteLevel");
  // The post-processor only adds tokens for add_special_tokens=True, which encode never asks.
  Model model = read_model(reader, root);
  const auto model_size = static_cast<uint32_t>(model.vocab.texts.size());

  // Added tokens get ids as tokenizers' AddedVocabulary::add_tokens gives them, in the file's
  // order: a token of the model's vocabulary keeps its id, any other takes the next id after
  // the model's and the added tokens' so far. The file's ids must be those.
  std::vector<AddedToken> added;
  uint32_t next_id = model_size;
  if (const json* list = FileReader::find(root, "added_tokens");
      list != nullptr && !list->is_null()) {
    if (!list->is_array()) reader.fail("added_tokens is ", shown(*list), "; expected an array");
    std::unordered_map<std::string, size_t> seen;
    for (size_t i = 0; i < list->size(); ++i) {
      const json& entry = (*list)[i];
      const std::string path = "added_tokens[" + std::to_string(i) + "]";
      if (!entry.is_object()) reader.fail(path, " is ", shown(entry), "; expected an object");
      AddedToken token;
      token.content = reader.string_at(entry, "content", path + ".content");
      const std::string named = path + " (" + shown(json(token.content)) + ")";
      if (token.content.empty()) reader.fail(path, ".content is empty; expected the token's text");
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (reader.bool_at(entry, flag, named + "." + flag, false)) {
          reader.fail(named, ".", flag, " is true; expected false (lstrip, rstrip and single_word ",
                      "are not supported)");
        }
      }
      // "normalized" decides the matching pass; with no normalizer (checked above) both
      // passes see the same text.
      token.normalized = reader.bool_at(entry, "normalized", named + ".normalized", true);
      token.special = reader.bool_at(entry, "special", named + ".special", false);
      if (const auto [it, inserted] = seen.emplace(token.content, i); !inserted)
        reader.fail(named, " repeats added_tokens[", it->second, "]; expected each content once");
      const auto in_model = model.vocab.ids.find(token.content);
      const uint32_t expected = in_model != model.vocab.ids.end() ? in_model->second : next_id++;
      token.id = reader.id_at(entry, "id", named + ".id");
      if (token.id != expected) {
        reader.fail(named, ".id is ", token.id, " but tokenizers gives it ", expected,
                    "; expected a model token's own id, and ids after the model's vocabulary (",
                    model_size, ") in the order of added_tokens");
      }
      added.push_back(std::move(token));
    }
  }

  std::vector<std::optional<std::string>> token_bytes(model_size);
  std::unordered_map<std::string, uint32_t> other_tokens;
  for (uint32_t id = 0; id < model_size; ++id) {
    token_bytes[id] = byte_level_decode(model.vocab.texts[id]);
    if (!token_bytes[id]) other_tokens.emplace(model.vocab.texts[id], id);
  }
  Bpe bpe(token_bytes, model.merges, model.ignore_merges);
  if (model.unk_token) {
    if (model.vocab.ids.find(*model.unk_token) == model.vocab.ids.end())
      reader.fail("model.unk_token ", shown(json(*model.unk_token)), " is not in model.vocab");
    if (!bpe.covers_every_byte()) {
      reader.fail("model.unk_token is ", shown(json(*model.unk_token)),
                  " and some byte has no token; expected null, or a token for every byte (so that "
                  "the unknown token is never used)");
    }
  }

  // ByteLevel's decoder: a token all in the byte-level alphabet is the bytes it stands for;
  // any other (an added token with a real space) is its own UTF-8.
  std::vector<const std::string*> texts(next_id);
  std::vector<uint8_t> special(next_id, 0);
  for (uint32_t id = 0; id < model_size; ++id)
    texts[id] = &model.vocab.texts[id];
  for (const AddedToken& token : added) {
    texts[token.id] = &token.content;
    if (token.special) special[token.id] = 1;
  }
  std::vector<uint32_t> decode_offsets;
  std::string decode_bytes;
  decode_offsets.reserve(next_id + 1);
  decode_offsets.push_back(0);
  for (uint32_t id = 0; id < next_id; ++id) {
    const std::optional<std::string> bytes = byte_level_decode(*texts[id]);
    decode_bytes += bytes ? *bytes : *texts[id];
    if (decode_bytes.size() >= std::numeric_limits<uint32_t>::max())
      reader.fail("the tokens' text exceeds 4 GiB; expected a tokenizer of ordinary size");
    decode_offsets.push_back(static_cast<uint32_t>(decode_bytes.size()));
  }

  auto state = std::make_unique<State>(State{
      .origin = origin,
      .pattern = pattern,
      .bpe = std::move(bpe),
      .added = AddedTokens(std::move(added)),
      .vocab_size = next_id,
      .decode_offsets = std::move(decode_offsets),
      .decode_bytes = std::move(decode_bytes),
      .special = std::move(special),
      .other_tokens = std::move(other_tokens),
  });
  return Tokenizer(std::move(state));
}

}  // namespace loom::text
