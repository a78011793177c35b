#include "data/default_corpus.h"

#include <array>
#include <cstddef>
#include <string_view>

#include "tensor/random.h"

namespace loom::data {

namespace {

constexpr std::array kNames = {"the weaver",  "a spinner",  "the old loom", "my neighbour",
                               "the shuttle", "a merchant", "the river",    "her apprentice"};
constexpr std::array kVerbs = {"carries", "mends", "sells",   "dyes",
                               "counts",  "folds", "follows", "remembers"};
constexpr std::array kObjects = {"the red thread",      "a bolt of linen", "seven spools",
                                 "the morning wool",    "a cotton sheet",  "the silk pattern",
                                 "two baskets of yarn", "the blue cloth"};
constexpr std::array kPlaces = {"by the window", "in the market",   "near the mill",
                                "before dawn",   "along the canal", "under the lamp"};
constexpr std::array kLinks = {" and then ", " while ", " because ", " so "};

template <size_t N>
std::string_view pick(const std::array<const char*, N>& words, Generator& gen) {
  return words[static_cast<size_t>(gen.uniform() * N)];
}

void append(std::vector<uint8_t>& text, std::string_view words) {
  text.insert(text.end(), words.begin(), words.end());
}

// "name verb object[ place]", appended to text.
void append_clause(std::vector<uint8_t>& text, Generator& gen) {
  append(text, pick(kNames, gen));
  text.push_back(' ');
  append(text, pick(kVerbs, gen));
  text.push_back(' ');
  append(text, pick(kObjects, gen));
  if (gen.uniform() < 0.5) {
    text.push_back(' ');
    append(text, pick(kPlaces, gen));
  }
}

}  // namespace

// Written into the vector as it is drawn (no string per sentence: under the sanitizers this
// function was a seventh of a short train_gpt run). The draws come in a fixed order: a linked
// sentence draws its second clause before its link word, the order GCC 12 gave the
// `pick(kLinks, gen) + clause(gen)` this replaced, whose operands C++ leaves unsequenced (clang
// drew the link first, so the two compilers' corpora differed from the second sentence on).
std::vector<uint8_t> default_corpus(size_t bytes) {
  Generator gen(20261121);
  std::vector<uint8_t> text;
  text.reserve(bytes + 256);
  int sentences_in_paragraph = 0;
  while (text.size() < bytes) {
    const size_t sentence = text.size();
    append_clause(text, gen);
    if (gen.uniform() < 0.4) {
      const size_t second = text.size();
      append_clause(text, gen);
      const std::string_view link = pick(kLinks, gen);
      text.insert(text.begin() + static_cast<std::ptrdiff_t>(second), link.begin(), link.end());
    }
    text[sentence] = static_cast<uint8_t>(text[sentence] - 'a' + 'A');
    append(text, gen.uniform() < 0.8 ? ". " : "! ");
    if (++sentences_in_paragraph == 5) {
      text.back() = '\n';
      sentences_in_paragraph = 0;
    }
  }
  text.resize(bytes);
  return text;
}

}  // namespace loom::data
