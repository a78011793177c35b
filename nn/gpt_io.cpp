#include "nn/gpt_io.h"

#include <regex>

namespace loom::nn {

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
      fail("[train_gpt] checkpoint has no 2-D '", name,
           "'; expected a GPT-2 state (wte.weight [V, C], wpe.weight [T, C], h.N.*)");
    }
    return it->second;
  };
  GPTConfig config;
  config.vocab_size = need("wte.weight").size(0);
  config.embd = need("wte.weight").size(1);
  config.context = need("wpe.weight").size(0);
  int64_t layers = 0;
  static const std::regex block(R"(h\.(\d+)\..*)");
  for (const auto& [name, tensor] : state) {
    std::smatch m;
    if (std::regex_match(name, m, block)) layers = std::max<int64_t>(layers, std::stoll(m[1]) + 1);
  }
  config.layers = layers;
  auto heads = contents.metadata.find("loom.heads");
  config.heads = heads != contents.metadata.end() ? std::stoll(heads->second) : heads_if_unknown;
  return config;
}

}  // namespace loom::nn
