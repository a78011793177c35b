// Module trees: hierarchical names, state_dict and load_state_dict errors.

#include <gtest/gtest.h>

#include "nn/gpt.h"
#include "tensor/ops.h"

namespace loom::nn {
namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.vocab_size = 16;
  c.context = 8;
  c.layers = 2;
  c.heads = 2;
  c.embd = 8;
  return c;
}

TEST(Module, GptParameterNamesAndShapesFollowHuggingFaceGpt2) {
  GPT model(tiny(), 0);
  std::vector<std::pair<std::string, Shape>> expected = {
      {"wte.weight", {16, 8}},
      {"wpe.weight", {8, 8}},
      {"h.0.ln_1.weight", {8}},
      {"h.0.ln_1.bias", {8}},
      {"h.0.attn.c_attn.weight", {8, 24}},
      {"h.0.attn.c_attn.bias", {24}},
      {"h.0.attn.c_proj.weight", {8, 8}},
      {"h.0.attn.c_proj.bias", {8}},
      {"h.0.ln_2.weight", {8}},
      {"h.0.ln_2.bias", {8}},
      {"h.0.mlp.c_fc.weight", {8, 32}},
      {"h.0.mlp.c_fc.bias", {32}},
      {"h.0.mlp.c_proj.weight", {32, 8}},
      {"h.0.mlp.c_proj.bias", {8}},
  };
  auto named = model.named_parameters();
  ASSERT_EQ(named.size(), 2 + 12 * 2 + 2u);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(named[i].first, expected[i].first);
    EXPECT_EQ(named[i].second.shape(), expected[i].second) << named[i].first;
  }
  EXPECT_EQ(named[14].first, "h.1.ln_1.weight");
  EXPECT_EQ(named.back().first, "ln_f.bias");
  for (auto& [name, p] : named)
    EXPECT_TRUE(p.requires_grad()) << name;
}

TEST(Module, InitialisationIsDeterministicAndGpt2Like) {
  GPT a(tiny(), 7), b(tiny(), 7), c(tiny(), 8);
  EXPECT_EQ(a.state_dict().at("h.1.mlp.c_fc.weight").to_vector<float>(),
            b.state_dict().at("h.1.mlp.c_fc.weight").to_vector<float>());
  EXPECT_NE(a.state_dict().at("wte.weight").to_vector<float>(),
            c.state_dict().at("wte.weight").to_vector<float>());
  auto sd = a.state_dict();
  for (float v : sd.at("h.0.attn.c_attn.bias").to_vector<float>())
    EXPECT_EQ(v, 0.0f);
  for (float v : sd.at("ln_f.weight").to_vector<float>())
    EXPECT_EQ(v, 1.0f);
}

TEST(Module, LoadStateDictCopiesIntoTheSameParameters) {
  GPT src(tiny(), 1), dst(tiny(), 2);
  Tensor handle = dst.state_dict().at("wte.weight");
  dst.load_state_dict(src.state_dict());
  EXPECT_EQ(handle.to_vector<float>(), src.state_dict().at("wte.weight").to_vector<float>());
}

TEST(Module, LoadStateDictReportsMissingUnexpectedAndMisshaped) {
  GPT model(tiny(), 0);
  StateDict state = model.state_dict();
  state.erase("h.1.ln_2.bias");
  state.emplace("lm_head.weight", Tensor::zeros({16, 8}));
  try {
    model.load_state_dict(state);
    FAIL();
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("missing: h.1.ln_2.bias"), std::string::npos) << what;
    EXPECT_NE(what.find("unexpected: lm_head.weight"), std::string::npos) << what;
  }
  EXPECT_NO_THROW(model.load_state_dict(state, /*strict=*/false));
  StateDict bad = model.state_dict();
  bad["wpe.weight"] = Tensor::zeros({4, 8});
  try {
    model.load_state_dict(bad);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wpe.weight (checkpoint [4, 8], model [8, 8])"),
              std::string::npos)
        << e.what();
  }
}

TEST(Module, ConfigValidation) {
  GPTConfig c = tiny();
  c.heads = 3;
  EXPECT_THROW(GPT(c, 0), Error);
  GPT model(tiny(), 0);
  EXPECT_THROW(model.forward(Tensor::zeros({1, 9}, DType::I64)), Error);  // longer than context
  EXPECT_THROW(model.forward(Tensor::from_vector<int64_t>({16}, {1, 1})), Error);  // token >= V
}

}  // namespace
}  // namespace loom::nn
