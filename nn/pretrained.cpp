#include "nn/pretrained.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/regular_file.h"
#include "core/tags.h"
#include "nn/gpt_io.h"
#include "tensor/safetensors.h"

namespace loom::nn {

namespace {

constexpr double kGpt2LayerNormEps = 1e-5;  // nn/gpt.cpp's, fixed

const Tag& kTag = tag::kPretrained;

// config[key] as T, or `fallback` when absent or null; a value of the wrong type names the key.
template <typename T>
T value_or(const nlohmann::json& config, const char* key, T fallback, const std::string& origin) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    kTag.fail(origin, ": \"", key, "\" is ", it->dump(), "; expected a ",
              std::is_same_v<T, bool> ? "boolean" : std::is_arithmetic_v<T> ? "number" : "string");
  }
}

int64_t required_size(const nlohmann::json& config, const char* key, const std::string& origin) {
  const auto value = value_or<int64_t>(config, key, -1, origin);
  if (value <= 0) kTag.fail(origin, ": \"", key, "\" is missing or not a positive integer");
  return value;
}

template <typename T>
void require(const nlohmann::json& config, const char* key, T wanted, T fallback,
             const std::string& origin, const char* why) {
  const T value = value_or<T>(config, key, fallback, origin);
  if (value != wanted) {
    kTag.fail(origin, ": \"", key, "\" is ", nlohmann::json(value).dump(), "; Loom supports only ",
              nlohmann::json(wanted).dump(), " (", why, ")");
  }
}

ModelSpec gpt2_from_hf_config(const nlohmann::json& c, const std::string& origin) {
  ModelSpec spec;
  spec.architecture = Architecture::kGpt2;
  spec.gpt.vocab_size = required_size(c, "vocab_size", origin);
  spec.gpt.context = required_size(c, "n_positions", origin);
  spec.gpt.layers = required_size(c, "n_layer", origin);
  spec.gpt.heads = required_size(c, "n_head", origin);
  spec.gpt.embd = required_size(c, "n_embd", origin);
  const std::string activation =
      value_or<std::string>(c, "activation_function", "gelu_new", origin);
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh") {
    kTag.fail(origin, ": \"activation_function\" is \"", activation,
              "\"; Loom's GPT-2 uses the tanh GELU (\"gelu_new\")");
  }
  require<double>(c, "layer_norm_epsilon", kGpt2LayerNormEps, kGpt2LayerNormEps, origin,
                  "GPT-2's layer norm epsilon");
  require<int64_t>(c, "n_inner", 4 * spec.gpt.embd, 4 * spec.gpt.embd, origin,
                   "GPT-2's MLP is 4 x n_embd wide");
  require<bool>(c, "tie_word_embeddings", true, true, origin, "GPT-2 ties lm_head to wte");
  require<bool>(c, "scale_attn_by_inverse_layer_idx", false, false, origin,
                "attention scaled by 1/sqrt(head_dim) only");
  require<bool>(c, "reorder_and_upcast_attn", false, false, origin,
                "attention scaled by 1/sqrt(head_dim) only");
  spec.gpt.validate();
  return spec;
}

ModelSpec llama_from_hf_config(const nlohmann::json& c, const std::string& origin) {
  ModelSpec spec;
  spec.architecture = Architecture::kLlama;
  LlamaConfig& l = spec.llama;
  l.vocab_size = required_size(c, "vocab_size", origin);
  l.context = required_size(c, "max_position_embeddings", origin);
  l.layers = required_size(c, "num_hidden_layers", origin);
  l.heads = required_size(c, "num_attention_heads", origin);
  l.kv_heads = value_or<int64_t>(c, "num_key_value_heads", l.heads, origin);
  l.hidden = required_size(c, "hidden_size", origin);
  l.intermediate = required_size(c, "intermediate_size", origin);
  l.head_dim = value_or<int64_t>(c, "head_dim", 0, origin);
  if (l.head_dim == l.hidden / l.heads) l.head_dim = 0;  // the default, said explicitly
  l.rms_norm_eps = value_or<double>(c, "rms_norm_eps", 1e-6, origin);
  l.tie_embeddings = value_or<bool>(c, "tie_word_embeddings", false, origin);
  // transformers 4 keeps rope_theta at the top level, transformers 5 in rope_parameters.
  l.rope_theta = value_or<double>(c, "rope_theta", 10000.0, origin);
  if (auto rope = c.find("rope_parameters"); rope != c.end() && rope->is_object()) {
    l.rope_theta = value_or<double>(*rope, "rope_theta", l.rope_theta, origin);
    require<std::string>(*rope, "rope_type", "default", "default", origin + " rope_parameters",
                         "rope scaling is not implemented");
  }
  if (auto scaling = c.find("rope_scaling"); scaling != c.end() && !scaling->is_null()) {
    kTag.fail(origin, ": \"rope_scaling\" is ", scaling->dump(),
              "; rope scaling (Llama 3.1's) is not implemented: expected null");
  }
  require<std::string>(c, "hidden_act", "silu", "silu", origin, "Llama's SwiGLU MLP");
  require<bool>(c, "attention_bias", false, false, origin, "Llama has no biases");
  require<bool>(c, "mlp_bias", false, false, origin, "Llama has no biases");
  l.validate();
  return spec;
}

nlohmann::json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_regular_file(path.string(), kTag, "a JSON file");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    kTag.fail(path.string(), ": not valid JSON (", e.what(), ")");
  }
}

const Tensor& need(const StateDict& state, const std::string& name, int64_t dims,
                   const std::string& origin) {
  auto it = state.find(name);
  if (it == state.end() || it->second.dim() != dims)
    kTag.fail(origin, ": no ", dims, "-D tensor '", name, "'");
  return it->second;
}

// Llama's sizes from the tensors of a bare file (what config.json would say otherwise).
ModelSpec llama_from_tensors(const safetensors::Contents& contents, const ModelSpec& defaults,
                             const std::string& origin) {
  const StateDict& state = contents.tensors;
  // A "loom.KEY" number of the metadata (save_weights_file's), or `fallback` without one.
  auto meta = [&](const char* key, double fallback) {
    auto it = contents.metadata.find(std::string("loom.") + key);
    if (it == contents.metadata.end()) return fallback;
    double value = 0;
    const std::string& text = it->second;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || !(value >= 0)) {
      kTag.fail(origin, ": metadata 'loom.", key, "' is '", text,
                "'; expected a non-negative number");
    }
    return value;
  };
  ModelSpec spec;
  spec.architecture = Architecture::kLlama;
  LlamaConfig& l = spec.llama;
  l = defaults.llama;
  const Tensor& embed = need(state, "model.embed_tokens.weight", 2, origin);
  l.vocab_size = embed.size(0);
  l.hidden = embed.size(1);
  l.layers = numbered_layer_count(state, "model.layers.");
  l.intermediate = need(state, "model.layers.0.mlp.gate_proj.weight", 2, origin).size(0);
  l.heads = static_cast<int64_t>(meta("heads", static_cast<double>(l.heads)));
  l.head_dim = static_cast<int64_t>(meta("head_dim", 0));
  const int64_t head_dim = l.attention_head_dim();
  l.kv_heads = need(state, "model.layers.0.self_attn.k_proj.weight", 2, origin).size(0) /
               std::max<int64_t>(head_dim, 1);
  l.context = static_cast<int64_t>(meta("context", static_cast<double>(l.context)));
  l.rope_theta = meta("rope_theta", l.rope_theta);
  l.rms_norm_eps = meta("rms_norm_eps", l.rms_norm_eps);
  l.tie_embeddings = state.count("lm_head.weight") == 0;
  l.validate();
  return spec;
}

// The parameter shapes a Llama of `l` has, to check a checkpoint against its config.
std::map<std::string, Shape> llama_shapes(const LlamaConfig& l) {
  const int64_t d = l.attention_head_dim();
  std::map<std::string, Shape> shapes{{"model.embed_tokens.weight", {l.vocab_size, l.hidden}},
                                      {"model.norm.weight", {l.hidden}}};
  if (!l.tie_embeddings) shapes["lm_head.weight"] = {l.vocab_size, l.hidden};
  for (int64_t i = 0; i < l.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    shapes[p + "input_layernorm.weight"] = {l.hidden};
    shapes[p + "post_attention_layernorm.weight"] = {l.hidden};
    shapes[p + "self_attn.q_proj.weight"] = {l.heads * d, l.hidden};
    shapes[p + "self_attn.k_proj.weight"] = {l.kv_heads * d, l.hidden};
    shapes[p + "self_attn.v_proj.weight"] = {l.kv_heads * d, l.hidden};
    shapes[p + "self_attn.o_proj.weight"] = {l.hidden, l.heads * d};
    shapes[p + "mlp.gate_proj.weight"] = {l.intermediate, l.hidden};
    shapes[p + "mlp.up_proj.weight"] = {l.intermediate, l.hidden};
    shapes[p + "mlp.down_proj.weight"] = {l.hidden, l.intermediate};
  }
  return shapes;
}

// Loom's state from a Llama checkpoint, checked against the config's shapes: every
// parameter present with its shape (a tied lm_head.weight some files carry is dropped).
StateDict llama_state(StateDict tensors, const LlamaConfig& l, const std::string& origin) {
  if (l.tie_embeddings) tensors.erase("lm_head.weight");
  tensors.erase("model.rotary_emb.inv_freq");  // a buffer older transformers saved
  const auto shapes = llama_shapes(l);
  for (const auto& [name, shape] : shapes) {
    auto it = tensors.find(name);
    if (it == tensors.end()) kTag.fail(origin, ": no tensor '", name, "' (the config needs it)");
    if (it->second.shape() != shape) {
      kTag.fail(origin, ": tensor '", name, "' is ", shape_str(it->second.shape()),
                " but the config's sizes give ", shape_str(shape));
    }
  }
  for (const auto& [name, tensor] : tensors)
    if (shapes.count(name) == 0) kTag.fail(origin, ": unexpected tensor '", name, "'");
  return tensors;
}

// The tensors of a directory's weights: model.safetensors, or the shards its index lists.
safetensors::Contents read_directory_weights(const std::filesystem::path& dir) {
  const auto single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(single)) return safetensors::load(single);
  if (!std::filesystem::exists(index)) {
    kTag.fail(dir.string(), ": no model.safetensors or model.safetensors.index.json; expected a "
              "Hugging Face model directory (save_pretrained's layout)");
  }
  const nlohmann::json j = read_json_file(index);
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    kTag.fail(index.string(), ": no \"weight_map\" object");
  std::map<std::string, std::set<std::string>> by_file;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) kTag.fail(index.string(), ": weight_map[\"", name, "\"] is not a file name");
    by_file[file.get<std::string>()].insert(name);
  }
  safetensors::Contents all;
  for (const auto& [file, names] : by_file) {
    const std::filesystem::path shard = dir / file;
    if (file.find('/') != std::string::npos || !std::filesystem::exists(shard)) {
      kTag.fail(index.string(), " names shard '", file, "', which is not a file in ", dir.string());
    }
    safetensors::Contents part = safetensors::load(shard);
    for (const std::string& name : names) {
      auto it = part.tensors.find(name);
      if (it == part.tensors.end())
        kTag.fail(index.string(), ": tensor '", name, "' is not in ", shard.string());
      all.tensors.emplace(name, it->second);
    }
    all.metadata.insert(part.metadata.begin(), part.metadata.end());
  }
  return all;
}

void copy_file_atomically(const std::filesystem::path& from, const std::filesystem::path& to) {
  write_file_atomically(to, read_regular_file(from.string(), kTag, "a tokenizer file"), kTag);
}

}  // namespace

std::string architecture_name(Architecture architecture) {
  return architecture == Architecture::kLlama ? "llama" : "gpt2";
}

Architecture parse_architecture(const std::string& name) {
  if (name == "gpt2") return Architecture::kGpt2;
  if (name == "llama") return Architecture::kLlama;
  kTag.fail("unknown model '", name, "'; expected gpt2 or llama");
}

std::unique_ptr<CausalLM> ModelSpec::build(uint64_t seed) const {
  if (architecture == Architecture::kLlama) return std::make_unique<Llama>(llama, seed);
  return std::make_unique<GPT>(gpt, seed);
}

bool ModelSpec::checkpoints_activations() const {
  return architecture == Architecture::kLlama ? llama.checkpoint_activations
                                              : gpt.checkpoint_activations;
}

namespace {

nlohmann::json hf_config_object(const ModelSpec& spec) {
  if (spec.architecture == Architecture::kGpt2) {
    const GPTConfig& g = spec.gpt;
    return {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", g.vocab_size},
            {"n_positions", g.context},
            {"n_embd", g.embd},
            {"n_layer", g.layers},
            {"n_head", g.heads},
            {"n_inner", nullptr},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", kGpt2LayerNormEps},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"initializer_range", 0.02},
            {"tie_word_embeddings", true},
            // transformers' GPT-2 defaults (50256) lie outside a smaller vocabulary.
            {"bos_token_id", nullptr},
            {"eos_token_id", nullptr},
            {"dtype", "float32"}};
  }
  const LlamaConfig& l = spec.llama;
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", l.vocab_size},
          {"max_position_embeddings", l.context},
          {"hidden_size", l.hidden},
          {"intermediate_size", l.intermediate},
          {"num_hidden_layers", l.layers},
          {"num_attention_heads", l.heads},
          {"num_key_value_heads", l.kv_heads},
          {"head_dim", l.attention_head_dim()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", l.rms_norm_eps},
          {"rope_theta", l.rope_theta},
          {"rope_parameters", {{"rope_theta", l.rope_theta}, {"rope_type", "default"}}},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"initializer_range", 0.02},
          {"tie_word_embeddings", l.tie_embeddings},
          {"dtype", "float32"}};
}

ModelSpec spec_from_hf_config_object(const nlohmann::json& config, const std::string& origin) {
  if (!config.is_object()) kTag.fail(origin, ": expected a JSON object");
  const std::string type = value_or<std::string>(config, "model_type", "", origin);
  if (type == "gpt2") return gpt2_from_hf_config(config, origin);
  if (type == "llama") return llama_from_hf_config(config, origin);
  kTag.fail(origin, ": \"model_type\" is \"", type,
            "\"; Loom reads \"gpt2\" (GPT2LMHeadModel) and \"llama\" (LlamaForCausalLM)");
}

}  // namespace

std::string hf_config(const ModelSpec& spec) {
  return hf_config_object(spec).dump(2) + "\n";
}

ModelSpec spec_from_hf_config(std::string_view config_json, const std::string& origin) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_json);
  } catch (const nlohmann::json::exception& e) {
    kTag.fail(origin, ": not valid JSON (", e.what(), ")");
  }
  return spec_from_hf_config_object(config, origin);
}

Pretrained load_pretrained(const std::filesystem::path& path, const ModelSpec& defaults) {
  Pretrained out;
  const std::string origin = path.string();
  if (std::filesystem::is_directory(path)) {
    const auto config_path = path / "config.json";
    if (!std::filesystem::exists(config_path)) {
      kTag.fail(origin, ": no config.json; expected a Hugging Face model directory "
                "(config.json with model.safetensors or its shards)");
    }
    out.spec = spec_from_hf_config_object(read_json_file(config_path), config_path.string());
    safetensors::Contents contents = read_directory_weights(path);
    if (out.spec.architecture == Architecture::kLlama) {
      out.state = llama_state(std::move(contents.tensors), out.spec.llama, origin);
    } else {
      const GPTConfig stored = gpt_config_from_checkpoint(contents, out.spec.gpt.heads);
      const GPTConfig& c = out.spec.gpt;
      if (stored.vocab_size != c.vocab_size || stored.embd != c.embd ||
          stored.context != c.context || stored.layers != c.layers) {
        kTag.fail(origin, ": config.json gives vocab ", c.vocab_size, ", n_embd ", c.embd,
                  ", n_positions ", c.context, ", n_layer ", c.layers,
                  " but the weights have vocab ", stored.vocab_size, ", n_embd ", stored.embd,
                  ", n_positions ", stored.context, ", n_layer ", stored.layers);
      }
      out.state = gpt_state_from_checkpoint(contents);
    }
    if (std::filesystem::exists(path / "tokenizer.json")) out.tokenizer = path / "tokenizer.json";
    return out;
  }
  safetensors::Contents contents = safetensors::load(path);
  if (contents.tensors.count("model.embed_tokens.weight") > 0) {
    out.spec = llama_from_tensors(contents, defaults, origin);
    out.state = llama_state(std::move(contents.tensors), out.spec.llama, origin);
  } else {
    out.spec.architecture = Architecture::kGpt2;
    out.spec.gpt = gpt_config_from_checkpoint(contents, defaults.gpt.heads);
    out.state = gpt_state_from_checkpoint(contents);
  }
  return out;
}

safetensors::Metadata weights_metadata(const ModelSpec& spec) {
  if (spec.architecture == Architecture::kGpt2) return gpt_metadata(spec.gpt);
  const LlamaConfig& l = spec.llama;
  auto number = [](double v) { return nlohmann::json(v).dump(); };
  return {{"format", "pt"},
          {"loom.architecture", "llama"},
          {"loom.heads", std::to_string(l.heads)},
          {"loom.head_dim", std::to_string(l.head_dim)},
          {"loom.context", std::to_string(l.context)},
          {"loom.rope_theta", number(l.rope_theta)},
          {"loom.rms_norm_eps", number(l.rms_norm_eps)}};
}

void save_weights_file(const std::filesystem::path& path, const CausalLM& model,
                       const ModelSpec& spec) {
  safetensors::save(path, model.state_dict(), weights_metadata(spec));
}

void save_pretrained(const std::filesystem::path& dir, const CausalLM& model,
                     const ModelSpec& spec, const std::filesystem::path& tokenizer,
                     int64_t max_shard_bytes) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) kTag.fail(dir.string(), ": cannot create the directory: ", error.message());
  const safetensors::Metadata metadata = weights_metadata(spec);
  const StateDict state = model.state_dict();
  // Shards in name order, each up to max_shard_bytes (one tensor larger than that alone).
  std::vector<safetensors::TensorMap> shards(1);
  int64_t shard_bytes = 0, total = 0;
  for (const auto& [name, tensor] : state) {
    const int64_t bytes = tensor.numel() * static_cast<int64_t>(dtype_size(tensor.dtype()));
    if (shard_bytes > 0 && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace(name, tensor);
    shard_bytes += bytes;
    total += bytes;
  }
  if (shards.size() == 1) {
    safetensors::save(dir / "model.safetensors", shards[0], metadata);
  } else {
    nlohmann::json weight_map = nlohmann::json::object();
    const size_t n = shards.size();
    for (size_t k = 0; k < n; ++k) {
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", k + 1, n);
      safetensors::save(dir / file, shards[k], metadata);
      for (const auto& [name, tensor] : shards[k])
        weight_map[name] = file;
    }
    const nlohmann::json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
    write_file_atomically(dir / "model.safetensors.index.json", index.dump(2) + "\n", kTag);
  }
  write_file_atomically(dir / "config.json", hf_config(spec), kTag);
  if (!tokenizer.empty()) {
    copy_file_atomically(tokenizer, dir / "tokenizer.json");
    for (const char* sibling : {"tokenizer_config.json", "special_tokens_map.json"}) {
      const auto from = tokenizer.parent_path() / sibling;
      if (std::filesystem::exists(from)) copy_file_atomically(from, dir / sibling);
    }
    // AutoTokenizer needs a class; tokenizer.json alone says everything else.
    if (!std::filesystem::exists(tokenizer.parent_path() / "tokenizer_config.json")) {
      write_file_atomically(dir / "tokenizer_config.json",
                            R"({"tokenizer_class": "PreTrainedTokenizerFast"})" "\n", kTag);
    }
  }
}

}  // namespace loom::nn
