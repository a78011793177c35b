#include "data/default_corpus.h"

#include <array>
#include <string>

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
const char* pick(const std::array<const char*, N>& words, Generator& gen) {
  return words[static_cast<size_t>(gen.uniform() * N)];
}

std::string clause(Generator& gen) {
  std::string s = pick(kNames, gen);
  s += ' ';
  s += pick(kVerbs, gen);
  s += ' ';
  s += pick(kObjects, gen);
  if (gen.uniform() < 0.5) {
    s += ' ';
    s += pick(kPlaces, gen);
  }
  return s;
}

}  // namespace

std::vector<uint8_t> default_corpus(size_t bytes) {
  Generator gen(20261121);
  std::vector<uint8_t> text;
  text.reserve(bytes + 256);
  int sentences_in_paragraph = 0;
  while (text.size() < bytes) {
    std::string sentence = clause(gen);
    if (gen.uniform() < 0.4) sentence += pick(kLinks, gen) + clause(gen);
    sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
    sentence += gen.uniform() < 0.8 ? ". " : "! ";
    if (++sentences_in_paragraph == 5) {
      sentence.back() = '\n';
      sentences_in_paragraph = 0;
    }
    text.insert(text.end(), sentence.begin(), sentence.end());
  }
  text.resize(bytes);
  return text;
}

}  // namespace loom::data
