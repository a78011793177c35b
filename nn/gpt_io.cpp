#include "nn/gpt_io.h"

#include <charconv>
#include <optional>
#include <regex>
#include <set>

#include "core/tags.h"

namespace loom::nn {

namespace {

// `text` as a decimal integer in [min, max]; nullopt for anything else (signs, spaces,
// letters, values out of range or past int64).
std::optional<int64_t> integer_in(const std::string& text, int64_t min, int64_t max) {
  int64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || text[0] == '-' || error != std::errc() || stop != end || value < min ||
      value > max) {
    return std::nullopt;
  }
  return value;
}

// The attention heads the metadata "loom.heads" records (gpt_metadata): a divisor of the
// embedding width `embd`. nullopt when the file does not record it (GPT-2 files).
std::optional<int64_t> recorded_heads(const safetensors::Metadata& metadata, int64_t embd) {
  auto heads = metadata.find("loom.heads");
  if (heads == metadata.end()) return std::nullopt;
  const std::optional<int64_t> value = integer_in(heads->second, 1, embd);
  if (!value || embd % *value != 0) {
    tag::kTrainGpt.fail("checkpoint metadata 'loom.heads' is '", heads->second,
                        "'; expected the number of attention heads: an integer from 1 to ", embd,
                        " that divides the embedding width ", embd);
  }
  return value;
}

}  // namespace

int64_t numbered_layer_count(const StateDict& state, const std::string& prefix) {
  const int64_t largest = static_cast<int64_t>(state.size()) - 1;  // one tensor per layer at least
  std::set<int64_t> seen;
  for (const auto& [name, tensor] : state) {
    if (!name.starts_with(prefix)) continue;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) continue;
    const std::string digits = name.substr(prefix.size(), dot - prefix.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::optional<int64_t> index = integer_in(digits, 0, largest);
    if (!index) {
      tag::kTrainGpt.fail("checkpoint tensor '", name, "' has block index ", digits,
                          "; expected ", prefix, "N with N from 0 to ", largest,
                          " (the file holds ", state.size(), " tensors)");
    }
    seen.insert(*index);
  }
  const int64_t count = seen.empty() ? 0 : *seen.rbegin() + 1;
  for (int64_t n = 0; n < count; ++n) {
    if (seen.count(n) == 0) {
      tag::kTrainGpt.fail("checkpoint has tensors of block ", prefix, count - 1,
                          " but none of block ", prefix, n, "; expected every block from ",
                          prefix, "0 to ", prefix, count - 1);
    }
  }
  return count;
}

safetensors::Metadata gpt_metadata(const GPTConfig& c) {
  return {{"format", "pt"},
          {"loom.layers", std::to_string(c.layers)},
          {"loom.heads", std::to_string(c.heads)},
          {"loom.embd", std::to_string(c.embd)},
          {"loom.context", std::to_string(c.context)},
          {"loom.vocab_size", std::to_string(c.vocab_size)}};
}

void save_gpt(const std::filesystem::path& path, const GPT& model) {
  safetensors::save(path, model.state_dict(), gpt_metadata(model.config()));
}

StateDict gpt_state_from_checkpoint(const safetensors::Contents& contents) {
  static const std::regex mask_buffer(R"(h\.\d+\.attn\.(bias|masked_bias))");
  StateDict state;
  for (const auto& [full_name, tensor] : contents.tensors) {
    std::string name = full_name;
    if (name.starts_with("transformer.")) name = name.substr(12);
    if (name == "lm_head.weight") continue;
    if (std::regex_match(name, mask_buffer)) continue;
    state.emplace(name, tensor);
  }
  return state;
}

GPTConfig gpt_config_from_checkpoint(const safetensors::Contents& contents,
                                     int64_t heads_if_unknown) {
  StateDict state = gpt_state_from_checkpoint(contents);
  auto need = [&](const std::string& name) -> const Tensor& {
    auto it = state.find(name);
    if (it == state.end() || it->second.dim() != 2) {
      tag::kTrainGpt.fail(
          "checkpoint has no 2-D '", name,
          "'; expected a GPT-2 state (wte.weight [V, C], wpe.weight [T, C], h.N.*)");
    }
    return it->second;
  };
  GPTConfig config;
  config.vocab_size = need("wte.weight").size(0);
  config.embd = need("wte.weight").size(1);
  config.context = need("wpe.weight").size(0);
  config.layers = numbered_layer_count(state, "h.");
  config.heads = recorded_heads(contents.metadata, config.embd).value_or(heads_if_unknown);
  return config;
}

}  // namespace loom::nn
