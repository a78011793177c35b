// Hugging Face model directories both ways (nn/pretrained.h): what transformers'
// save_pretrained wrote (tests/data/llama_tiny, its sharded twin llama_tiny_sharded, gpt2_tiny;
// scripts/make_llama_reference.py) loads, GPT-2's logits equal transformers'; what Loom writes
// (single file and shards) reads back to the bit with transformers' config keys; every
// refusal names the file and what was expected. That transformers loads Loom's directories
// with Loom's loss is checked live by bench/models/check_transformers.py.

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/pretrained.h"

#ifndef LOOM_TEST_DATA_DIR
#error "LOOM_TEST_DATA_DIR must name tests/data (set in tests/CMakeLists.txt)"
#endif

namespace loom::nn {
namespace {

namespace fs = std::filesystem;
const fs::path kData = LOOM_TEST_DATA_DIR;

// A fresh directory for one test, removed with it.
class Pretrained : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom_pretrained_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

void expect_same_state(const StateDict& a, const StateDict& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_EQ(t.shape(), b.at(name).shape()) << name;
    EXPECT_EQ(t.to(DType::F32).to_vector<float>(), b.at(name).to(DType::F32).to_vector<float>())
        << name;
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST_F(Pretrained, ReadsTransformersLlamaDirectorySingleAndSharded) {
  const nn::Pretrained single = load_pretrained(kData / "llama_tiny", {});
  const nn::Pretrained sharded = load_pretrained(kData / "llama_tiny_sharded", {});
  ASSERT_EQ(single.spec.architecture, Architecture::kLlama);
  const LlamaConfig& l = single.spec.llama;
  EXPECT_EQ(l.vocab_size, 256);
  EXPECT_EQ(l.hidden, 64);
  EXPECT_EQ(l.intermediate, 128);
  EXPECT_EQ(l.layers, 2);
  EXPECT_EQ(l.heads, 4);
  EXPECT_EQ(l.kv_heads, 2);
  EXPECT_EQ(l.context, 64);
  EXPECT_EQ(l.rope_theta, 10000.0);
  EXPECT_EQ(l.rms_norm_eps, 1e-5);
  EXPECT_FALSE(l.tie_embeddings);
  EXPECT_EQ(hf_config(sharded.spec), hf_config(single.spec));
  expect_same_state(single.state, sharded.state);
  auto model = single.spec.build(0);
  model->load_state_dict(single.state);  // strict: every parameter, no stray tensor
}

TEST_F(Pretrained, Gpt2DirectoryGivesTransformersLogits) {
  const nn::Pretrained gpt2 = load_pretrained(kData / "gpt2_tiny", {});
  ASSERT_EQ(gpt2.spec.architecture, Architecture::kGpt2);
  EXPECT_EQ(gpt2.spec.gpt.heads, 4);  // from config.json (a bare GPT-2 file does not say)
  auto model = gpt2.spec.build(0);
  model->load_state_dict(gpt2.state);
  std::ifstream in(kData / "llama_tiny_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  // The probe of the reference: samples 0 and 1 of the LCG's step 1000, 16 tokens.
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 2; ++i) {
    int64_t x = (977 * 1000 + 131 * i + 17) % 256;
    for (int64_t t = 0; t < 16; ++t, x = (5 * x + 3) % 256)
      tokens.push_back(x);
  }
  NoGradGuard no_grad;
  const std::vector<float> logits =
      model->forward(Tensor::from_vector(tokens, {2, 16})).to_vector<float>();
  const auto want = ref.at("gpt2_probe_logits_first_row").get<std::vector<double>>();
  for (size_t t = 0; t < 16; ++t)
    for (size_t v = 0; v < 8; ++v)
      EXPECT_NEAR(logits[t * 256 + v], want[t * 8 + v], 1e-5 * std::max(1.0, std::abs(want[t * 8 + v])));
  double abs_sum = 0;
  for (float v : logits)
    abs_sum += std::abs(v);
  EXPECT_NEAR(abs_sum, ref.at("gpt2_probe_logits_abs_sum").get<double>(), 1e-5 * abs_sum);
}

TEST_F(Pretrained, SavedDirectoriesReadBackToTheBit) {
  for (const bool tied : {false, true}) {
    for (const int64_t shard_bytes : {int64_t{5} << 30, int64_t{20000}}) {
      SCOPED_TRACE((tied ? "tied, " : "untied, ") + std::to_string(shard_bytes) + " B shards");
      ModelSpec spec;
      spec.architecture = Architecture::kLlama;
      spec.llama.tie_embeddings = tied;
      spec.llama.hidden = 32;
      spec.llama.intermediate = 48;
      auto model = spec.build(3);
      const fs::path out = dir_ / (std::to_string(tied) + "_" + std::to_string(shard_bytes));
      save_pretrained(out, *model, spec, {}, shard_bytes);
      const bool sharded = shard_bytes < 100000;
      EXPECT_EQ(fs::exists(out / "model.safetensors.index.json"), sharded);
      EXPECT_EQ(fs::exists(out / "model.safetensors"), !sharded);
      std::ifstream in(out / "config.json");
      const nlohmann::json config = nlohmann::json::parse(in);
      EXPECT_EQ(config.at("model_type"), "llama");
      EXPECT_EQ(config.at("architectures")[0], "LlamaForCausalLM");
      EXPECT_EQ(config.at("num_key_value_heads"), 2);
      EXPECT_EQ(config.at("tie_word_embeddings"), tied);
      const nn::Pretrained back = load_pretrained(out, {});
      EXPECT_EQ(hf_config(back.spec), hf_config(spec));
      expect_same_state(back.state, model->state_dict());
    }
  }
  ModelSpec gpt;
  auto model = gpt.build(1);
  save_pretrained(dir_ / "gpt2", *model, gpt);
  const nn::Pretrained back = load_pretrained(dir_ / "gpt2", {});
  EXPECT_EQ(back.spec.architecture, Architecture::kGpt2);
  expect_same_state(back.state, model->state_dict());
}

// A bf16 checkpoint (as most published ones are) trains in f32: its values, exactly.
TEST_F(Pretrained, Bf16DirectoryLoadsIntoF32Weights) {
  const nn::Pretrained f32 = load_pretrained(kData / "llama_tiny", {});
  const fs::path out = dir_ / "bf16";
  fs::create_directories(out);
  safetensors::TensorMap halved;
  for (const auto& [name, t] : f32.state)
    halved.emplace(name, t.to(DType::BF16));
  safetensors::save(out / "model.safetensors", halved, {{"format", "pt"}});
  fs::copy_file(kData / "llama_tiny" / "config.json", out / "config.json");
  const nn::Pretrained bf16 = load_pretrained(out, {});
  auto model = bf16.spec.build(0);
  model->load_state_dict(bf16.state);
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_EQ(p.dtype(), DType::F32) << name;
    EXPECT_EQ(p.to_vector<float>(), halved.at(name).to(DType::F32).to_vector<float>()) << name;
  }
}

TEST_F(Pretrained, BareLlamaFileCarriesItsSizes) {
  ModelSpec spec;
  spec.architecture = Architecture::kLlama;
  spec.llama.heads = 8;
  spec.llama.kv_heads = 1;
  spec.llama.rope_theta = 500000.0;
  auto model = spec.build(2);
  save_weights_file(dir_ / "w.safetensors", *model, spec);
  const nn::Pretrained back = load_pretrained(dir_ / "w.safetensors", {});
  EXPECT_EQ(hf_config(back.spec), hf_config(spec));
  expect_same_state(back.state, model->state_dict());
}

TEST_F(Pretrained, RefusesWhatItCannotReadFaithfully) {
  auto copy_of_tiny = [&](const std::string& name) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    fs::copy(kData / "llama_tiny", d, fs::copy_options::recursive);
    return d;
  };
  auto with_config = [&](const std::string& name, const std::function<void(nlohmann::json&)>& f) {
    const fs::path d = copy_of_tiny(name);
    std::ifstream in(d / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    f(config);
    write_text(d / "config.json", config.dump());
    return error_of([&] { load_pretrained(d, {}); });
  };
  {
    std::string e = with_config("bert", [](auto& c) { c["model_type"] = "bert"; });
    EXPECT_NE(e.find("\"model_type\" is \"bert\"; Loom reads \"gpt2\""), std::string::npos) << e;
    e = with_config("scaled", [](auto& c) { c["rope_scaling"] = {{"rope_type", "llama3"}}; });
    EXPECT_NE(e.find("rope scaling (Llama 3.1's) is not implemented"), std::string::npos) << e;
    e = with_config("gelu", [](auto& c) { c["hidden_act"] = "gelu"; });
    EXPECT_NE(e.find("\"hidden_act\" is \"gelu\"; Loom supports only \"silu\""), std::string::npos)
        << e;
    e = with_config("wide", [](auto& c) { c["intermediate_size"] = 256; });
    EXPECT_NE(e.find("mlp.down_proj.weight' is [64, 128] but the config's sizes give [64, 256]"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("wide"), std::string::npos) << "the error names the directory: " << e;
  }
  const fs::path no_config = copy_of_tiny("no_config");
  fs::remove(no_config / "config.json");
  EXPECT_NE(error_of([&] { load_pretrained(no_config, {}); }).find("no config.json"),
            std::string::npos);
  const fs::path lost_shard = dir_ / "lost_shard";
  fs::create_directories(lost_shard);
  fs::copy(kData / "llama_tiny_sharded", lost_shard, fs::copy_options::recursive);
  fs::remove(lost_shard / "model-00003-of-00005.safetensors");
  const std::string e = error_of([&] { load_pretrained(lost_shard, {}); });
  EXPECT_NE(e.find("names shard 'model-00003-of-00005.safetensors', which is not a file"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace loom::nn
