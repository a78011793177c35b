#include "strategies/deepspeed_config.h"

#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <map>

#include <nlohmann/json.hpp>

#include "core/regular_file.h"
#include "core/registry.h"
#include "core/tags.h"

namespace loom::strategies {

namespace {

using nlohmann::json;

// What Loom does with a key of one section. Section: a nested object checked with its own
// table. Read: mapped onto Loom. Ignored: read, not acted on; `why` goes into the warning
// (a key that matters only when true/false warns only then, see warn_when).
enum class Use { Read, Ignored, Section };
struct Key {
  const char* name;
  Use use;
  const char* why = "";
  std::optional<bool> warn_when = std::nullopt;  // Ignored booleans: warn only for this value
};

const std::vector<Key>& keys_of(const std::string& section) {
  static const std::map<std::string, std::vector<Key>> tables = {
      {"",
       {{"zero_optimization", Use::Section},
        {"bf16", Use::Section},
        {"bfloat16", Use::Section},
        {"fp16", Use::Section},
        {"optimizer", Use::Section},
        {"train_batch_size", Use::Read},
        {"train_micro_batch_size_per_gpu", Use::Read},
        {"gradient_accumulation_steps", Use::Read},
        {"gradient_clipping", Use::Read},
        {"steps_per_print", Use::Ignored, "train_gpt prints every --log-interval steps"},
        {"wall_clock_breakdown", Use::Ignored, "use --trace for a timeline of each step"},
        {"zero_allow_untested_optimizer", Use::Ignored, "the engine shards any Loom optimizer"},
        {"zero_force_ds_cpu_optimizer", Use::Ignored, "offloaded steps use Loom's CPU kernels"},
        {"prescale_gradients", Use::Ignored, "gradients are averaged in one reduction"},
        {"gradient_predivide_factor", Use::Ignored, "gradients are averaged in one reduction"},
        {"communication_data_type", Use::Ignored,
         "gradients are reduced in the parameters' dtype"},
        {"scheduler", Use::Ignored, "the schedule comes from --schedule and --warmup-steps"}}},
      {"zero_optimization",
       {{"stage", Use::Read},
        {"offload_optimizer", Use::Section},
        {"offload_param", Use::Section},
        {"overlap_comm", Use::Ignored, "Loom always overlaps reduction with backward", false},
        {"contiguous_gradients", Use::Ignored, "gradients always live in flat buffers", false},
        {"reduce_scatter", Use::Ignored, "stages 2-3 always reduce-scatter", false},
        {"allgather_partitions", Use::Ignored, "updated shards are always all-gathered", false},
        {"reduce_bucket_size", Use::Ignored,
         "each unit's gradients are reduced as one flat buffer; choose units with --wrap-policy"},
        {"allgather_bucket_size", Use::Ignored,
         "each unit is gathered as one flat buffer; choose units with --wrap-policy"},
        {"round_robin_gradients", Use::Ignored, "shards are contiguous ranges of each unit"},
        {"stage3_prefetch_bucket_size", Use::Ignored,
         "stage 3 prefetches whole units (--forward-prefetch, --backward-prefetch)"},
        {"stage3_param_persistence_threshold", Use::Ignored,
         "small parameters are sharded like the rest; wrap them in a larger unit"},
        {"stage3_max_live_parameters", Use::Ignored,
         "at most one unit is gathered ahead (limit_all_gathers)"},
        {"stage3_max_reuse_distance", Use::Ignored, "units are freed after each use"},
        {"stage3_gather_16bit_weights_on_model_save", Use::Ignored,
         "--save always writes the gathered model"},
        {"elastic_checkpoint", Use::Ignored, "checkpoints are issue 10's work"},
        {"ignore_unused_parameters", Use::Ignored,
         "every parameter must receive a gradient under the sharded strategies"},
        {"sub_group_size", Use::Read}}},
      {"offload",
       {{"device", Use::Read},
        {"nvme_path", Use::Read},
        {"pin_memory", Use::Ignored, "host memory is pinned only for a GPU", true},
        {"buffer_count", Use::Read},
        {"buffer_size", Use::Ignored, "NVMe buffers hold one sub-group (sub_group_size)"},
        {"max_in_cpu", Use::Ignored, "parameter shards are read just before their all-gather"},
        {"fast_init", Use::Ignored, "the swap file is written once at setup"},
        {"pipeline_read", Use::Ignored,
         "reads of the next sub-group always overlap the step (buffer_count >= 2)"},
        {"pipeline_write", Use::Ignored,
         "writes of the last sub-group always overlap the step (buffer_count >= 3)"},
        {"ratio", Use::Ignored, "the whole optimizer step is offloaded"}}},
      {"bf16",
       {{"enabled", Use::Read},
        {"immediate_grad_update", Use::Ignored, "gradients are kept in the parameters' dtype"}}},
      {"fp16",
       {{"enabled", Use::Read},
        {"loss_scale", Use::Read},
        {"initial_scale_power", Use::Read},
        {"loss_scale_window", Use::Read},
        {"min_loss_scale", Use::Read},
        {"hysteresis", Use::Ignored, "the scale backs off by half on every overflow"},
        {"consecutive_hysteresis", Use::Ignored, "the scale backs off on every overflow"},
        {"auto_cast", Use::Ignored, "16-mixed always autocasts the matmuls"}}},
      {"optimizer", {{"type", Use::Read}, {"params", Use::Section}}},
      {"optimizer.params",
       {{"lr", Use::Read},
        {"betas", Use::Read},
        {"eps", Use::Read},
        {"weight_decay", Use::Read},
        {"adam_w_mode", Use::Read},
        {"momentum", Use::Read},
        {"dampening", Use::Read},
        {"nesterov", Use::Read},
        {"torch_adam", Use::Ignored, "Loom's AdamW is its own"},
        {"bias_correction", Use::Ignored, "AdamW always corrects the bias", false},
        {"amsgrad", Use::Read}}},
  };
  return tables.at(section);
}

// The table for the object at dotted `path` ("zero_optimization.offload_param" -> "offload").
std::string table_for(const std::string& path) {
  if (path == "zero_optimization.offload_optimizer" || path == "zero_optimization.offload_param")
    return "offload";
  if (path == "bfloat16") return "bf16";
  return path;
}

std::string dotted(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// 1-based line and column of byte `offset` in `text`.
std::pair<size_t, size_t> line_and_column(const std::string& text, size_t offset) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return {line, column};
}

class Reader {
 public:
  Reader(std::string source, DeepSpeedConfig& config) : source_(std::move(source)), config_(config) {}

  // Checks every key of the object at `path` against its table, recursing into sections.
  void check(const json& object, const std::string& path) {
    if (!object.is_object()) wrong(path, "an object", object);
    const std::vector<Key>& table = keys_of(table_for(path));
    for (const auto& [key, value] : object.items()) {
      const Key* known = nullptr;
      for (const Key& k : table)
        if (key == k.name) known = &k;
      if (known == nullptr) {
        std::vector<std::string> names;
        for (const Key& k : table)
          names.push_back(dotted(path, k.name));
        tag::kDeepspeedConfig.fail(source_, ": unknown key '", dotted(path, key),
                                   "'; did you mean '", closest_name(dotted(path, key), names),
                                   "'?");
      }
      if (known->use == Use::Section) check(value, dotted(path, key));
      if (known->use != Use::Ignored) continue;
      if (known->warn_when && !(value.is_boolean() && value.get<bool>() == *known->warn_when))
        continue;
      config_.warnings.push_back(dotted(path, key) + " is read but not acted on: " + known->why);
    }
  }

  static bool is_auto(const json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

  [[noreturn]] void wrong(const std::string& key, const std::string& expected, const json& got) {
    tag::kDeepspeedConfig.fail(source_, ": ", key.empty() ? "the top level" : key, ": expected ",
                               expected, ", got ", got.dump());
  }

  std::optional<int64_t> integer(const json& object, const std::string& path,
                                 const std::string& key, int64_t min, int64_t max) {
    if (!object.contains(key) || is_auto(object[key])) return std::nullopt;
    const json& v = object[key];
    const std::string range = "an integer " + std::to_string(min) + "-" + std::to_string(max);
    // DeepSpeed's own examples write sizes as 1e9: a whole float is an integer too.
    const bool whole = v.is_number_float() && std::isfinite(v.get<double>()) &&
                       std::trunc(v.get<double>()) == v.get<double>() &&
                       std::abs(v.get<double>()) < 9.2e18;
    if (!v.is_number_integer() && !whole) wrong(dotted(path, key), range, v);
    const int64_t n = whole ? static_cast<int64_t>(v.get<double>()) : v.get<int64_t>();
    if (n < min || n > max) wrong(dotted(path, key), range, v);
    return n;
  }

  std::optional<double> number(const json& object, const std::string& path,
                               const std::string& key) {
    if (!object.contains(key) || is_auto(object[key])) return std::nullopt;
    const json& v = object[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0)
      wrong(dotted(path, key), "a non-negative number", v);
    return v.get<double>();
  }

  // A number that must be above zero (Adam's eps: zero divides by zero for a zero moment).
  std::optional<double> positive(const json& object, const std::string& path,
                                 const std::string& key) {
    const std::optional<double> value = number(object, path, key);
    if (value && *value <= 0) wrong(dotted(path, key), "a number above 0", object[key]);
    return value;
  }

  std::optional<bool> boolean(const json& object, const std::string& path,
                              const std::string& key) {
    if (!object.contains(key) || is_auto(object[key])) return std::nullopt;
    if (!object[key].is_boolean()) wrong(dotted(path, key), "true or false", object[key]);
    return object[key].get<bool>();
  }

  std::string device(const json& object, const std::string& path) {
    if (!object.contains("device") || is_auto(object["device"])) return "none";
    const json& v = object["device"];
    if (!v.is_string() || (v != "none" && v != "cpu" && v != "nvme"))
      wrong(dotted(path, "device"), "\"none\", \"cpu\" or \"nvme\"", v);
    return v.get<std::string>();
  }

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  DeepSpeedConfig& config_;
};

}  // namespace

DeepSpeedConfig parse_deepspeed_config(const std::string& json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    auto [line, column] = line_and_column(json_text, e.byte > 0 ? e.byte - 1 : 0);
    // nlohmann's message repeats the position: keep what follows it.
    std::string reason = e.what();
    if (auto at = reason.find(": ", reason.find("column")); at != std::string::npos)
      reason = reason.substr(at + 2);
    tag::kDeepspeedConfig.fail(source, " is not valid JSON at line ", line, ", column ", column,
                               ": ", reason);
  } catch (const json::out_of_range& e) {  // a number past double's range, such as 1e400
    std::string reason = e.what();
    if (auto at = reason.find("] "); at != std::string::npos) reason = reason.substr(at + 2);
    tag::kDeepspeedConfig.fail(source, " is not valid JSON: ", reason);
  }
  DeepSpeedConfig config;
  Reader r(source, config);
  r.check(root, "");

  config.train_batch_size = r.integer(root, "", "train_batch_size", 1, INT64_MAX);
  config.micro_batch_per_gpu = r.integer(root, "", "train_micro_batch_size_per_gpu", 1, INT64_MAX);
  config.gradient_accumulation_steps =
      r.integer(root, "", "gradient_accumulation_steps", 1, INT64_MAX);
  config.gradient_clipping = r.number(root, "", "gradient_clipping");

  if (root.contains("zero_optimization")) {
    const json& zero = root["zero_optimization"];
    const std::string path = "zero_optimization";
    if (auto stage = r.integer(zero, path, "stage", 0, 3)) config.stage = static_cast<int>(*stage);
    if (zero.contains("offload_optimizer")) {
      const json& offload = zero["offload_optimizer"];
      const std::string at = path + ".offload_optimizer";
      config.offload_optimizer = r.device(offload, at);
      if (offload.contains("nvme_path") && !Reader::is_auto(offload["nvme_path"])) {
        if (!offload["nvme_path"].is_string())
          r.wrong(at + ".nvme_path", "a directory path", offload["nvme_path"]);
        config.nvme_path = offload["nvme_path"].get<std::string>();
      }
      if (auto count = r.integer(offload, at, "buffer_count", 1, 1024))
        config.nvme_buffer_count = static_cast<int>(*count);
    }
    config.sub_group_size = r.integer(zero, path, "sub_group_size", 1, INT64_MAX);
    if (zero.contains("offload_param")) {
      const json& offload = zero["offload_param"];
      config.offload_param = r.device(offload, path + ".offload_param");
      if (offload.contains("nvme_path") && !Reader::is_auto(offload["nvme_path"])) {
        if (!offload["nvme_path"].is_string())
          r.wrong(path + ".offload_param.nvme_path", "a directory path", offload["nvme_path"]);
        config.param_nvme_path = offload["nvme_path"].get<std::string>();
      }
    }
    if (config.offload_param != "none" && config.stage.value_or(0) != 3) {
      tag::kDeepspeedConfig.fail(
          source,
          ": zero_optimization.offload_param needs stage 3 "
          "(parameters sharded), got stage ",
          config.stage.value_or(0),
          "; use offload_optimizer to offload master weights and optimizer state");
    }
  }
  const char* bf16_key = root.contains("bf16") ? "bf16" : "bfloat16";
  const bool bf16 = root.contains(bf16_key) && r.boolean(root[bf16_key], bf16_key, "enabled").value_or(false);
  const bool fp16 = root.contains("fp16") && r.boolean(root["fp16"], "fp16", "enabled").value_or(false);
  if (bf16 && fp16)
    tag::kDeepspeedConfig.fail(source, ": bf16 and fp16 are both enabled; pick one");
  // DeepSpeed's bf16 and fp16 modes are 16-bit weights with f32 masters (docs/sharding.md),
  // not built with NVMe offload: there bf16 falls back to autocast, as before they existed.
  const bool nvme = config.offload_optimizer == "nvme" || config.offload_param == "nvme";
  if (bf16 && nvme) {
    config.precision = "bf16-mixed";
    config.warnings.push_back(
        "bf16.enabled with NVMe offload: 16-bit weights are not built with NVMe offload, so "
        "the model keeps f32 weights and runs under bf16-mixed autocast");
  } else if (bf16) {
    config.weights_dtype = DType::BF16;
  }
  if (fp16 && nvme) {
    tag::kDeepspeedConfig.fail(source,
                               ": fp16 with NVMe offload is not built (f16 weights need the "
                               "f32 masters beside them); use bf16, or offload to \"cpu\"");
  }
  if (fp16) {
    config.weights_dtype = DType::F16;
    config.precision = "16-mixed";  // for its loss scaler
    const json& f = root["fp16"];
    // DeepSpeed's defaults: dynamic scaling from 2^16, growth every 1000 clean steps, floor 1.
    LossScalerOptions& s = config.loss_scaler;
    s.initial_scale = std::ldexp(1.0, static_cast<int>(r.integer(f, "fp16", "initial_scale_power", 0, 64).value_or(16)));
    s.growth_interval = static_cast<int>(r.integer(f, "fp16", "loss_scale_window", 1, INT32_MAX).value_or(1000));
    s.min_scale = r.number(f, "fp16", "min_loss_scale").value_or(1.0);
    if (const double fixed = r.number(f, "fp16", "loss_scale").value_or(0.0); fixed > 0) {
      s.initial_scale = fixed;  // a static scale: never grows or backs off
      s.growth = 1.0;
      s.backoff = 1.0;
    }
  }
  if (root.contains("optimizer")) {
    const json& o = root["optimizer"];
    if (!o.contains("type") || !o["type"].is_string())
      r.wrong("optimizer.type", "\"AdamW\", \"Adam\" or \"SGD\"", o.value("type", json()));
    std::string type = o["type"].get<std::string>();
    for (char& c : type)
      c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const json params = o.value("params", json::object());
    const bool adam_w_mode = r.boolean(params, "optimizer.params", "adam_w_mode").value_or(true);
    if (r.boolean(params, "optimizer.params", "amsgrad").value_or(false))
      tag::kDeepspeedConfig.fail(source,
                                 ": optimizer.params.amsgrad is not supported by Loom's AdamW");
    // A key of the other optimizer is a mistake worth naming.
    const std::string given = o["type"].get<std::string>();
    auto refuse = [&](std::initializer_list<const char*> keys, const char* owner) {
      for (const char* key : keys) {
        if (params.contains(key)) {
          tag::kDeepspeedConfig.fail(source, ": optimizer.params.", key, " belongs to ", owner,
                                     ", not ", given, "; drop it or change optimizer.type");
        }
      }
    };
    DeepSpeedConfig::Optimizer opt;
    opt.lr = r.number(params, "optimizer.params", "lr");
    opt.weight_decay = r.number(params, "optimizer.params", "weight_decay");
    if (type == "sgd") {
      refuse({"betas", "eps", "adam_w_mode"}, "Adam/AdamW");
      opt.type = "SGD";
      opt.momentum = r.number(params, "optimizer.params", "momentum");
      opt.dampening = r.number(params, "optimizer.params", "dampening");
      opt.nesterov = r.boolean(params, "optimizer.params", "nesterov");
      config.optimizer = opt;
      return config;
    }
    refuse({"momentum", "dampening", "nesterov"}, "SGD");
    if (type != "adamw" && !(type == "adam" && adam_w_mode)) {
      tag::kDeepspeedConfig.fail(
          source, ": optimizer.type '", given, "'",
          type == "adam" ? " with adam_w_mode false (L2 weight decay) is not built" : " is unknown",
          "; expected \"AdamW\", or \"Adam\" with adam_w_mode true");
    }
    opt.type = "AdamW";
    opt.eps = r.positive(params, "optimizer.params", "eps");
    if (params.contains("betas") && !Reader::is_auto(params["betas"])) {
      const json& b = params["betas"];
      const auto is_beta = [](const json& v) {
        return v.is_number() && v.get<double>() >= 0 && v.get<double>() < 1;
      };
      if (!b.is_array() || b.size() != 2 || !is_beta(b[0]) || !is_beta(b[1]))
        r.wrong("optimizer.params.betas", "an array of two numbers in [0, 1)", b);
      opt.beta1 = b[0].get<double>();
      opt.beta2 = b[1].get<double>();
    }
    config.optimizer = opt;
  }
  return config;
}

DeepSpeedConfig load_deepspeed_config(const std::string& path) {
  if (std::filesystem::is_directory(path))
    tag::kDeepspeedConfig.fail("'", path, "' is a folder; give the JSON file in it");
  if (!std::filesystem::exists(path))
    tag::kDeepspeedConfig.fail("cannot read '", path, "': no such file or not readable");
  return parse_deepspeed_config(
      read_regular_file(path, tag::kDeepspeedConfig, "DeepSpeed config (JSON)"), path);
}

std::string apply_deepspeed_config(const DeepSpeedConfig& config, StrategyConfig& options) {
  if (config.offload_param == "nvme") {
    // One swap file holds both (docs/sharding.md): the optimizer's must be on NVMe as well.
    if (config.offload_optimizer != "nvme") {
      tag::kDeepspeedConfig.fail(
          "offload_param device \"nvme\" needs offload_optimizer on "
          "\"nvme\" too (Loom keeps parameter shards and optimizer state in one swap file)");
    }
    if (!config.param_nvme_path.empty() && config.param_nvme_path != config.nvme_path) {
      tag::kDeepspeedConfig.fail(
          "offload_param.nvme_path '", config.param_nvme_path,
          "' differs from offload_optimizer.nvme_path '", config.nvme_path,
          "': Loom keeps both in one swap file; give them the same directory");
    }
    options.sharding.nvme_params = true;
  }
  if (config.offload_optimizer == "nvme") {
    if (config.nvme_path.empty()) {
      tag::kDeepspeedConfig.fail(
          "offload_optimizer device \"nvme\" needs "
          "offload_optimizer.nvme_path: a directory on a local disk for the swap file");
    }
    options.sharding.nvme_path = config.nvme_path;
  }
  if (config.nvme_buffer_count) options.sharding.nvme_buffer_count = *config.nvme_buffer_count;
  if (config.sub_group_size) options.sharding.sub_group_size = *config.sub_group_size;
  if (config.precision) options.precision = *config.precision;
  if (config.weights_dtype) options.sharding.weights_dtype = *config.weights_dtype;
  options.loss_scaler = config.loss_scaler;
  options.sharding.offload_optimizer = config.offload_optimizer != "none";
  options.sharding.offload_params = config.offload_param != "none";
  const int stage = config.stage.value_or(0);  // DeepSpeed's default: no ZeRO
  if (stage == 0) {
    options.fsdp_sharding_strategy = "NO_SHARD";
    return "fsdp";
  }
  return "deepspeed_stage_" + std::to_string(stage);
}

void check_deepspeed_batch_sizes(const DeepSpeedConfig& config, int64_t micro_batch,
                                 int64_t accumulation, int world_size) {
  if (!config.train_batch_size) return;
  // The sizes come from the config: their product may not fit in int64.
  int64_t product = 0;
  const bool overflow = __builtin_mul_overflow(micro_batch, accumulation, &product) ||
                        __builtin_mul_overflow(product, int64_t{world_size}, &product);
  if (overflow || *config.train_batch_size != product) {
    tag::kDeepspeedConfig.fail(
        "train_batch_size ", *config.train_batch_size,
        " must equal train_micro_batch_size_per_gpu ", micro_batch,
        " x gradient_accumulation_steps ", accumulation, " x world size ", world_size, " = ",
        overflow ? std::string("more than 2^63 - 1") : std::to_string(product));
  }
}

}  // namespace loom::strategies
