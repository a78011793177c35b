// loom-generate: continues a prompt with a trained model (nn/generate.h: a key/value cache,
// greedy or temperature / top-k / top-p sampling).
//
//   loom-generate --model DIR|FILE [--tokenizer tokenizer.json] (--prompt TEXT | --prompt-ids
//                 1,2,3) [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
//                 [--seed S] [--ids]
//
// --model is what train_gpt --save writes (a Hugging Face directory, whose tokenizer.json is
// used when --tokenizer is not given, or a safetensors file) or what transformers'
// save_pretrained writes. Without a tokenizer the prompt's bytes are its tokens (the models
// train_gpt trains on bytes). Prints the prompt and its continuation (decoded, or the ids with
// --ids); generation stops at the end-of-text token when the tokenizer has one. Exit 0, 1 on an
// error (one line), CLI11's codes on bad flags.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "core/tags.h"
#include "nn/generate.h"
#include "nn/pretrained.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

namespace tag = loom::tag;

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      ids.push_back(std::stoll(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      tag::kLoom.fail("--prompt-ids '", text, "': '", item,
                      "' is not an integer; expected ids separated by commas, e.g. 1,2,3");
    }
  }
  return ids;
}

int run(int argc, char** argv) {
  CLI::App app{"loom-generate: continue a prompt with a trained model"};
  std::string model_path, tokenizer_path, prompt, prompt_ids;
  loom::nn::SamplingOptions sampling;
  bool print_ids = false;
  app.add_option("--model", model_path, "a model directory or safetensors file")
      ->required()
      ->check(CLI::ExistingPath);
  app.add_option("--tokenizer", tokenizer_path,
                 "a tokenizer.json (default: the model directory's; none: bytes are tokens)")
      ->check(CLI::ExistingFile);
  auto* text = app.add_option("--prompt", prompt, "the prompt as text");
  auto* ids = app.add_option("--prompt-ids", prompt_ids, "the prompt as token ids, e.g. 1,2,3");
  text->excludes(ids);
  app.add_option("--max-new-tokens", sampling.max_new_tokens, "tokens to generate at most")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--temperature", sampling.temperature, "0: greedy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--top-k", sampling.top_k, "keep the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--top-p", sampling.top_p, "nucleus sampling's probability mass (1: all)")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  app.add_option("--seed", sampling.seed, "the sampling seed")->capture_default_str();
  app.add_flag("--ids", print_ids, "print token ids instead of text");
  CLI11_PARSE(app, argc, argv);
  if (prompt.empty() && prompt_ids.empty())
    tag::kLoom.fail("give a prompt: --prompt TEXT or --prompt-ids 1,2,3");

  const loom::nn::Pretrained pretrained = loom::nn::load_pretrained(model_path, {});
  const auto model = pretrained.spec.build(0);
  model->load_state_dict(pretrained.state);
  if (tokenizer_path.empty() && !pretrained.tokenizer.empty())
    tokenizer_path = pretrained.tokenizer.string();
  std::optional<loom::text::Tokenizer> tokenizer;
  if (!tokenizer_path.empty()) {
    tokenizer = loom::text::Tokenizer::from_file(tokenizer_path);
    sampling.stop_token = tokenizer->end_of_text();
  }
  std::vector<int64_t> input;
  if (!prompt_ids.empty()) {
    input = parse_ids(prompt_ids);
  } else if (tokenizer) {
    for (uint32_t id : tokenizer->encode(prompt)) input.push_back(id);
  } else {
    for (unsigned char c : prompt) input.push_back(c);
  }
  std::vector<int64_t> all = input;
  const std::vector<int64_t> generated = loom::nn::generate(*model, input, sampling);
  all.insert(all.end(), generated.begin(), generated.end());
  if (print_ids) {
    for (size_t i = 0; i < all.size(); ++i)
      std::printf("%s%lld", i ? "," : "", static_cast<long long>(all[i]));
    std::printf("\n");
  } else if (tokenizer) {
    std::printf("%s\n", tokenizer->decode(std::vector<uint32_t>(all.begin(), all.end())).c_str());
  } else {  // bytes, shown as UTF-8 with U+FFFD where they are not
    const std::string bytes(all.begin(), all.end());
    std::printf("%s\n", loom::text::utf8_lossy(bytes).c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // loom::Error and the standard library's: one line
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
