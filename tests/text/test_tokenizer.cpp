// text/: the tokenizer on the checked-in GPT-2-style and Llama 3-style files
// (tests/text/make_tokenizers.py), with ids computed by Hugging Face tokenizers 0.23.3 and
// pasted in, and the files it must refuse. tests/text/differential_tokenizers.py compares
// it with tokenizers on thousands of random strings.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "text/bpe.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

namespace fs = std::filesystem;
using loom::text::EncodeOptions;
using loom::text::Tokenizer;
using Ids = std::vector<uint32_t>;
using json = nlohmann::json;

fs::path file_of(const std::string& family) {
  return fs::path(LOOM_TOKENIZERS_DIR) / family / "tokenizer.json";
}

const Tokenizer& gpt2() {
  static const Tokenizer tokenizer = Tokenizer::from_file(file_of("gpt2-style"));
  return tokenizer;
}

const Tokenizer& llama3() {
  static const Tokenizer tokenizer = Tokenizer::from_file(file_of("llama3-style"));
  return tokenizer;
}

json json_of(const std::string& family) {
  std::ifstream in(file_of(family));
  return json::parse(in);
}

// The message of the loom::Error that loading `config` throws ("" when it loads).
std::string load_error(const json& config) {
  try {
    Tokenizer::from_json(config.dump(), "edited.json");
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Tokenizer, Gpt2StyleIdsAreTokenizers) {
  EXPECT_EQ(gpt2().encode("Hello, world! It's 2026."),
            (Ids{39, 362, 290, 11, 1817, 0, 1470, 301, 696, 13}));
  EXPECT_EQ(gpt2().encode("Größe 😀  \n\n x"), (Ids{38, 1856, 1942, 2065, 222, 289, 1783, 777}));
  EXPECT_EQ(gpt2().encode(" the module namespace"), (Ids{263, 634, 863, 983, 1189}));
  EXPECT_EQ(gpt2().encode("<|begin_of_text|>We'LL see 12345"),
            (Ids{27, 91, 1300, 70, 259, 62,   1123, 62,  331,  823,
                 91, 29, 54,   68, 6,   1137, 1517, 562, 1280, 20}));
  EXPECT_EQ(gpt2().encode(""), Ids{});
}

TEST(Tokenizer, Llama3StyleIdsAreTokenizers) {
  EXPECT_EQ(llama3().encode("Hello, world! It's 2026."),
            (Ids{39, 358, 288, 11, 1842, 0, 1489, 298, 220, 550, 21, 13}));
  EXPECT_EQ(llama3().encode("Größe 😀  \n\n x"), (Ids{38, 1896, 1977, 2104, 222, 287, 322, 785}));
  // "Ġmodule" and "Ġnamespace" are tokens that no merge builds: ignore_merges makes them one.
  EXPECT_EQ(llama3().encode(" the module namespace"), (Ids{263, 3018, 3019}));
  EXPECT_EQ(llama3().encode("<|begin_of_text|>We'LL see 12345"),
            (Ids{3032, 54, 68, 1854, 1533, 220, 353, 18, 808}));
}

TEST(Tokenizer, SpecialTokensAreSplitOutOrKeptAsText) {
  EXPECT_EQ(gpt2().encode("a<|endoftext|>b"), (Ids{64, 3000, 65}));
  EXPECT_EQ(llama3().encode("a<|endoftext|>b"), (Ids{64, 27, 91, 706, 1105, 327, 839, 91, 29, 65}));
  const EncodeOptions as_text{.match_special_tokens = false};
  EXPECT_EQ(gpt2().encode("a<|endoftext|>b<|begin_of_text|>", as_text),
            (Ids{64, 27,   91, 702, 1123, 331,  823, 91,  29,  65, 27,
                 91, 1300, 70, 259, 62,   1123, 62,  331, 823, 91, 29}));
  EXPECT_EQ(llama3().encode("a<|endoftext|>b<|begin_of_text|>", as_text),
            (Ids{64, 27,   91, 706, 1105, 327,  839, 91,  29,  65, 27,
                 91, 1340, 70, 259, 62,   1105, 62,  327, 839, 91, 29}));
  EXPECT_EQ(gpt2().end_of_text(), 3000u);
  EXPECT_EQ(llama3().end_of_text(), 3033u);  // <|end_of_text|>
  EXPECT_EQ(llama3().token_id("<|begin_of_text|>"), 3032u);
  EXPECT_EQ(gpt2().document_start(), 3000u);    // llm.c: <|endoftext|> before each document
  EXPECT_EQ(llama3().document_start(), 3032u);  // and Llama 3's <|begin_of_text|>
  EXPECT_EQ(gpt2().decode(Ids{64, 3000, 65}), "ab");
  EXPECT_EQ(gpt2().decode(Ids{64, 3000, 65}, /*skip_special_tokens=*/false), "a<|endoftext|>b");
  EXPECT_EQ(llama3().decode(Ids{3032, 54, 3033}, false), "<|begin_of_text|>W<|end_of_text|>");
}

TEST(Tokenizer, VocabularySizeAndTokenIds) {
  EXPECT_EQ(gpt2().vocab_size(), 3001u);
  EXPECT_EQ(llama3().vocab_size(), 3288u);  // 3032 model tokens and 256 special ones
  EXPECT_EQ(gpt2().token_id("Ġthe"), 263u);
  EXPECT_EQ(gpt2().token_id("<|endoftext|>"), 3000u);
  EXPECT_EQ(gpt2().token_id("the token that is not"), std::nullopt);
  EXPECT_EQ(gpt2().token_id("\xFF"), std::nullopt);
}

TEST(Tokenizer, DecodeOfEncodeIsTheText) {
  for (const std::string text :
       {"plain ascii", "Größe, Maße 😀👩‍👩‍👧‍👦 中文 ",
        "tabs\t\tand\r\nnewlines\n\n", "  leading", "'S 'ſ 're 'LL", "\u00a0\u3000\u180e x",
        "<|endoftext|> in the middle <|end_of_text|>"}) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(text), false), text);
    EXPECT_EQ(llama3().decode(llama3().encode(text), false), text);
  }
}

TEST(Tokenizer, DecodeRepairsCutCharactersAsFromUtf8Lossy) {
  const Ids e_acute = gpt2().encode("é");
  ASSERT_EQ(e_acute, (Ids{127, 102}));  // 0xC3, 0xA9
  EXPECT_EQ(gpt2().decode(Ids{127}), "\uFFFD");
  EXPECT_EQ(gpt2().decode(Ids{127, 64}), "\uFFFDa");
  EXPECT_EQ(gpt2().decode(Ids{102, 127}), "\uFFFD\uFFFD");
  EXPECT_EQ(gpt2().decode(Ids{127, 102}), "é");
}

TEST(Tokenizer, DecodeRefusesAnIdOutOfRange) {
  try {
    gpt2().decode(Ids{64, 3001});
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_EQ(std::string(e.what()), "[tokenizer] decode: id 3001 at index 1 is not a token of " +
                                         file_of("gpt2-style").string() +
                                         "; expected ids below its vocabulary size 3001");
  }
}

TEST(Tokenizer, EncodeRefusesTextThatIsNotUtf8) {
  try {
    gpt2().encode("ok \xC3\x28 then");
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[tokenizer] the text to encode is not well-formed UTF-8: byte 0xC3 at offset 3 does "
              "not start a valid sequence; expected UTF-8 text");
  }
  EXPECT_THROW(gpt2().encode("\xED\xA0\x80"), loom::Error);  // a surrogate
  EXPECT_THROW(gpt2().encode("\xF0\x9F\x98"), loom::Error);  // cut at the end
}

TEST(Tokenizer, MergesAsPairsAndAsStringsAgree) {
  json config = json_of("gpt2-style");
  ASSERT_TRUE(config["model"]["merges"][0].is_string());
  json pairs = json::array();
  for (const json& merge : config["model"]["merges"]) {
    const std::string line = merge.get<std::string>();
    pairs.push_back({line.substr(0, line.find(' ')), line.substr(line.find(' ') + 1)});
  }
  config["model"]["merges"] = pairs;
  const Tokenizer from_pairs = Tokenizer::from_json(config.dump(), "pairs.json");
  const std::string text = "Merges stored either way give the same tokens: 123 ümlaut 😀";
  EXPECT_EQ(from_pairs.encode(text), gpt2().encode(text));
  EXPECT_GT(gpt2().encode(text).size(), 5u);
}

// Note [Word cache] (text/bpe.cpp): each thread's cache holds one model's words at a time.
TEST(Tokenizer, TwoTokenizersTakeTurnsOnOneThread) {
  const std::string text = " the module namespace the module namespace";
  const Ids from_gpt2 = gpt2().encode(text);
  const Ids from_llama3 = llama3().encode(text);
  ASSERT_NE(from_gpt2, from_llama3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(gpt2().encode(text), from_gpt2);
    EXPECT_EQ(llama3().encode(text), from_llama3);
  }
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  const std::string text = "The same words, again and again: tokenizer, tokenizer, 1234567. ";
  const Ids expected = llama3().encode(text);
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i)
        wrong[t] += llama3().encode(text) != expected;
    });
  }
  for (std::thread& thread : threads)
    thread.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

// The quadratic search for short words and tokenizers' heap for long ones make the same merges.
TEST(Bpe, HeapAndQuadraticMergesAgree) {
  const json config = json_of("gpt2-style");
  std::vector<std::optional<std::string>> tokens(config["model"]["vocab"].size());
  std::map<std::string, uint32_t> ids;
  for (const auto& [text, id] : config["model"]["vocab"].items()) {
    tokens[id.get<uint32_t>()] = loom::text::byte_level_decode(text);
    ids[text] = id.get<uint32_t>();
  }
  std::vector<loom::text::MergeRule> rules;
  for (const json& merge : config["model"]["merges"]) {
    const std::string line = merge.get<std::string>();
    const std::string a = line.substr(0, line.find(' '));
    const std::string b = line.substr(line.find(' ') + 1);
    rules.push_back({ids.at(a), ids.at(b), ids.at(a + b)});
  }
  const loom::text::Bpe bpe(tokens, rules, false);
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {"e", "th", "in", "a", "tion", "ü", "😀", " ", "\n", "z"};
  for (int i = 0; i < 300; ++i) {
    std::string word;
    const int length = 1 + static_cast<int>(rng() % 120);
    for (int k = 0; k < length; ++k)
      word += parts[rng() % parts.size()];
    Ids small;
    Ids heap;
    bpe.merge_for_test(word, false, small);
    bpe.merge_for_test(word, true, heap);
    ASSERT_EQ(small, heap) << word;
  }
}

TEST(Unicode, ClassesAreUnicode16) {
  const auto& classes = loom::text::CharClasses::get();
  using loom::text::CharClass;
  EXPECT_EQ(classes(U'a'), CharClass::kLetter);
  EXPECT_EQ(classes(0x1C89), CharClass::kLetter);   // CYRILLIC CAPITAL LETTER TJE, Unicode 16.0
  EXPECT_EQ(classes(0x10D40), CharClass::kNumber);  // GARAY DIGIT ZERO, Unicode 16.0
  EXPECT_EQ(classes(0x2167), CharClass::kNumber);   // ROMAN NUMERAL EIGHT (Nl)
  EXPECT_EQ(classes(0x85), CharClass::kSpace);
  EXPECT_EQ(classes(0x3000), CharClass::kSpace);
  EXPECT_EQ(classes(0x180E), CharClass::kOther);  // a space until Unicode 6.3 (PCRE2's \s still)
  EXPECT_EQ(classes(0x200B), CharClass::kOther);  // ZERO WIDTH SPACE is not White_Space
  EXPECT_EQ(classes(0x10FFFF), CharClass::kOther);
}

TEST(Unicode, Utf8LossyIsRusts) {
  using loom::text::utf8_lossy;
  EXPECT_EQ(utf8_lossy("\xE2\x82"), "\uFFFD");
  EXPECT_EQ(utf8_lossy("\xE2\x82"
                       "A"),
            "\uFFFD"
            "A");
  EXPECT_EQ(utf8_lossy("\xFF\xFE"), "\uFFFD\uFFFD");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\uFFFD");
  EXPECT_EQ(utf8_lossy("\xED\xA0\x80"),
            "\uFFFD\uFFFD\uFFFD");                    // a surrogate: ED A0 is not a prefix
  EXPECT_EQ(utf8_lossy("\xC0\xAF"), "\uFFFD\uFFFD");  // an overlong '/'
  EXPECT_EQ(utf8_lossy("\xF4\x90\x80\x80"), "\uFFFD\uFFFD\uFFFD\uFFFD");  // above U+10FFFF
  EXPECT_EQ(utf8_lossy("ok 😀"), "ok 😀");
}

// --- files it must refuse, each with one line naming the field and what was expected ---

TEST(TokenizerFile, RefusesAnotherModelType) {
  json config = json_of("gpt2-style");
  config["model"]["type"] = "WordPiece";
  EXPECT_EQ(load_error(config),
            "[tokenizer] edited.json: model.type is WordPiece; expected BPE (byte-level BPE is "
            "the only model supported)");
}

TEST(TokenizerFile, RefusesBadJson) {
  try {
    Tokenizer::from_json("{\"model\": [1, 2,", "broken.json");
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_TRUE(std::string(e.what()).starts_with("[tokenizer] broken.json: not valid JSON ("))
        << e.what();
    EXPECT_TRUE(std::string(e.what()).ends_with("); expected a Hugging Face tokenizer.json"))
        << e.what();
  }
}

TEST(TokenizerFile, RefusesMergesNamingUnknownTokens) {
  json config = json_of("gpt2-style");
  config["model"]["merges"][5] = "Ġth nosuchtoken";
  EXPECT_EQ(load_error(config),
            "[tokenizer] edited.json: model.merges[5] (\"Ġth nosuchtoken\"): \"nosuchtoken\" is "
            "not in model.vocab");
  config = json_of("llama3-style");
  config["model"]["merges"][0] = {"Ġ", "Ġ"};
  const json id = config["model"]["vocab"]["ĠĠ"];
  config["model"]["vocab"].erase("ĠĠ");
  config["model"]["vocab"]["no merge makes this"] = id;
  const std::string error = load_error(config);
  EXPECT_NE(
      error.find("model.merges[0] ([\"Ġ\",\"Ġ\"]): the merged token \"ĠĠ\" is not in model.vocab"),
      std::string::npos)
      << error;
  config = json_of("gpt2-style");
  config["model"]["merges"][2] = "a b c";
  EXPECT_EQ(load_error(config),
            "[tokenizer] edited.json: model.merges[2] is \"a b c\"; expected two tokens separated "
            "by one space");
}

TEST(TokenizerFile, RefusesWhatItDoesNotImplement) {
  struct Case {
    std::string family;
    std::string pointer;
    json value;
    std::string error;  // after "[tokenizer] edited.json: "
  };
  const std::vector<Case> cases = {
      {"gpt2-style",
       "/normalizer",
       {{"type", "NFC"}},
       "normalizer is {\"type\":\"NFC\"}; expected null (no normalizer is supported)"},
      {"gpt2-style", "/model/byte_fallback", true,
       "model.byte_fallback is true; expected false (byte-level BPE has a token for every byte)"},
      {"gpt2-style", "/model/dropout", 0.1,
       "model.dropout is 0.1; expected null (BPE dropout is random)"},
      {"gpt2-style",
       "/pre_tokenizer",
       {{"type", "Whitespace"}},
       "pre_tokenizer is Whitespace; expected ByteLevel with use_regex true (GPT-2), or Sequence "
       "[Split with GPT-2's or Llama 3's regex, behavior Isolated, invert false; ByteLevel with "
       "use_regex false] (Llama 3)"},
      {"gpt2-style", "/pre_tokenizer/add_prefix_space", true,
       "pre_tokenizer.add_prefix_space is true; expected false (GPT-2's and Llama 3's setting)"},
      {"llama3-style", "/pre_tokenizer/pretokenizers/0/pattern/Regex", "\\s+",
       "pre_tokenizer.pretokenizers[0].pattern.Regex is \"\\\\s+\"; expected GPT-2's or Llama 3's "
       "split pattern, character for character (text/pre_tokenizer.h)"},
      {"llama3-style", "/pre_tokenizer/pretokenizers/0/behavior", "Removed",
       "pre_tokenizer.pretokenizers[0].behavior is Removed; expected Isolated"},
      {"gpt2-style",
       "/decoder",
       {{"type", "WordPiece"}},
       "decoder.type is WordPiece; expected ByteLevel"},
      {"gpt2-style", "/added_tokens/0/lstrip", true,
       "added_tokens[0] (\"<|endoftext|>\").lstrip is true; expected false (lstrip, rstrip and "
       "single_word are not supported)"},
      {"llama3-style", "/added_tokens/1/id", 3040,
       "added_tokens[1] (\"<|end_of_text|>\").id is 3040 but tokenizers gives it 3033; expected a "
       "model token's own id, and ids after the model's vocabulary (3032) in the order of "
       "added_tokens"},
      {"gpt2-style", "/model/vocab/Ġthe", 5,
       "model.vocab gives id 5 to both \"&\" and \"Ġthe\"; expected each id once"},
      {"gpt2-style",
       "/truncation",
       {{"max_length", 512}},
       "truncation is {\"max_length\":512}; expected null (encode never truncates)"},
  };
  for (const Case& c : cases) {
    json config = json_of(c.family);
    config[json::json_pointer(c.pointer)] = c.value;
    EXPECT_EQ(load_error(config), "[tokenizer] edited.json: " + c.error) << c.pointer;
  }
}

TEST(TokenizerFile, RefusesAFifo) {
  const fs::path dir = fs::temp_directory_path() / ("loom_tokenizer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path fifo = dir / "tokenizer.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    Tokenizer::from_file(fifo);
    ADD_FAILURE() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[tokenizer] " + fifo.string() +
                  ": is not a regular file (a FIFO, device, socket or directory); expected "
                  "Hugging Face tokenizer.json");
  }
  fs::remove_all(dir);
}

TEST(TokenizerFile, EndOfTextNeedsOneOfTheNames) {
  json config = json_of("gpt2-style");
  config["added_tokens"][0]["content"] = "<|eot|>";
  config["model"]["vocab"].erase("<|endoftext|>");
  config["model"]["vocab"]["<|eot|>"] = 3000;
  const Tokenizer tokenizer = Tokenizer::from_json(config.dump(), "edited.json");
  try {
    tokenizer.end_of_text();
    FAIL() << "no error";
  } catch (const loom::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "[tokenizer] edited.json: has no end-of-text token; expected <|endoftext|> (GPT-2) "
              "or <|end_of_text|> (Llama 3)");
  }
}

}  // namespace
