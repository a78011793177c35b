// The meta device (tensor/meta.h): every public op runs on meta tensors with the CPU's output
// shapes and allocations and reports its cost (a test fails for an op of tensor/ops.h that is
// not exercised here); GEMM and attention costs are their closed forms; a GPT-2 and a Llama
// training step (forward, backward, clipping, AdamW) on meta peak at the CPU run's bytes, kind
// by kind, exactly.

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "nn/gpt.h"
#include "nn/llama.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/sgd.h"
#include "tensor/allocator.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom {
namespace {

// Keeps every cost reported on this thread.
class CostLog final : public MetaCostSink {
 public:
  void record(const OpCost& cost) override { costs.push_back(cost); }
  std::vector<OpCost> costs;
};

// An input of the op cases: filled without random draws, whose CPU temporaries the meta run
// would not have (normal_ draws into a host vector first).
Tensor input_on(const Shape& shape, Device device, int seed = 1) {
  return Tensor::full(shape, 0.25 * seed + 0.5, DType::F32, device).set_requires_grad(true);
}

// One use of an op: builds its inputs on `device`, runs the op, returns what it produced.
struct OpCase {
  std::string op;  // the name declared in tensor/ops.h
  std::function<std::vector<Tensor>(Device)> run;
};

Tensor scalar_sum(const std::vector<Tensor>& outs) {
  Tensor total;
  for (const Tensor& out : outs) {
    if (!is_floating(out.dtype())) continue;
    Tensor s = sum(out);
    total = total.defined() ? add(total, s) : s;
  }
  return total;
}

std::vector<OpCase> op_cases() {
  auto r = [](const Shape& shape, Device d, int seed = 1) { return input_on(shape, d, seed); };
  auto tokens = [](Device d) {
    return Tensor::from_vector<int64_t>({0, 3, 1, 4, 2, 4}, {2, 3}, d);
  };
  using V = std::vector<Tensor>;
  return {
      {"add",
       [=](Device d) {
         return V{add(r({2, 3}, d), r({3}, d, 2)), add(r({4}, d), 2.0)};
       }},
      {"sub",
       [=](Device d) {
         return V{sub(r({2, 3}, d), r({2, 1}, d, 2))};
       }},
      {"mul",
       [=](Device d) {
         return V{mul(r({2, 3}, d), r({2, 3}, d, 2)), mul(r({5}, d), 3.0)};
       }},
      {"div",
       [=](Device d) {
         return V{div(r({2, 3}, d), add(r({2, 3}, d, 2), 10.0))};
       }},
      {"neg", [=](Device d) { return V{neg(r({7}, d))}; }},
      {"gelu",
       [=](Device d) {
         return V{gelu(r({3, 5}, d))};
       }},
      {"silu",
       [=](Device d) {
         return V{silu(r({3, 5}, d))};
       }},
      {"swiglu",
       [=](Device d) {
         return V{swiglu(r({3, 5}, d), r({3, 5}, d, 2))};
       }},
      {"rotary_embedding",
       [=](Device d) {
         Tensor x = permute(r({2, 3, 2, 4}, d), {0, 2, 1, 3});  // [B, T, H, D] seen as [B, H, T, D]
         return V{rotary_embedding(x, r({3, 4}, d, 2).detach(), r({3, 4}, d, 3).detach())};
       }},
      {"add_",
       [=](Device d) {
         Tensor a = r({2, 3}, d).detach();
         add_(a, r({3}, d, 2).detach());
         return V{a};
       }},
      {"mul_",
       [=](Device d) {
         Tensor a = r({6}, d).detach();
         mul_(a, 0.5);
         return V{a};
       }},
      {"fill_",
       [=](Device d) {
         Tensor a = Tensor::empty({4, 2}, DType::F32, d);
         fill_(a, 1.5);
         return V{a};
       }},
      {"copy_",
       [=](Device d) {
         Tensor a = Tensor::empty({3, 2}, DType::F64, d);
         copy_(a, transpose(r({2, 3}, d), 0, 1));
         return V{a};
       }},
      {"matmul",
       [=](Device d) {
         return V{matmul(r({4, 3}, d), r({3, 5}, d, 2)),
                  matmul(r({2, 4, 3}, d), r({2, 3, 2}, d, 3)),
                  matmul(transpose(r({3, 4}, d), 0, 1), r({3, 2}, d, 2))};
       }},
      {"linear",
       [=](Device d) {
         return V{linear(r({2, 3, 4}, d), r({4, 5}, d, 2), r({5}, d, 3))};
       }},
      {"layer_norm",
       [=](Device d) {
         return V{layer_norm(r({3, 8}, d), r({8}, d, 2), r({8}, d, 3))};
       }},
      {"bias_gelu",
       [=](Device d) {
         return V{bias_gelu(r({2, 3, 4}, d), r({4}, d, 2))};
       }},
      {"add_layer_norm",
       [=](Device d) {
         AddNorm out = add_layer_norm(r({3, 8}, d), r({3, 8}, d, 4), r({8}, d, 2),
                                           r({8}, d, 3));
         return V{out.sum, out.normed};
       }},
      {"add_rms_norm",
       [=](Device d) {
         AddNorm out = add_rms_norm(r({3, 8}, d), r({3, 8}, d, 4), r({8}, d, 2), 1e-5);
         return V{out.sum, out.normed};
       }},
      {"rms_norm",
       [=](Device d) {
         return V{rms_norm(r({3, 8}, d), r({8}, d, 2), 1e-5)};
       }},
      // The norms that keep or end a residual stream, after an f32 stream plus a bf16 branch
      // (whose add's backward they take over) and after a plain tensor.
      {"layer_norm_keeping_stream",
       [=](Device d) {
         Tensor x = add(r({3, 8}, d), cast(r({3, 8}, d, 4), DType::BF16));
         AddNorm out = layer_norm_keeping_stream(x, r({8}, d, 2), r({8}, d, 3), 1e-5, DType::BF16);
         AddNorm plain = layer_norm_keeping_stream(r({3, 8}, d, 5), r({8}, d, 2), r({8}, d, 3));
         return V{out.sum, out.normed, plain.sum, plain.normed};
       }},
      {"layer_norm_ending_stream",
       [=](Device d) {
         Tensor x = add(r({3, 8}, d), cast(r({3, 8}, d, 4), DType::BF16));
         return V{layer_norm_ending_stream(x, r({8}, d, 2), r({8}, d, 3), 1e-5, DType::BF16)};
       }},
      {"rms_norm_keeping_stream",
       [=](Device d) {
         Tensor x = add(r({3, 8}, d), cast(r({3, 8}, d, 4), DType::BF16));
         AddNorm out = rms_norm_keeping_stream(x, r({8}, d, 2), 1e-5, DType::BF16);
         return V{out.sum, out.normed};
       }},
      {"rms_norm_ending_stream",
       [=](Device d) {
         Tensor x = add(r({3, 8}, d), cast(r({3, 8}, d, 4), DType::BF16));
         return V{rms_norm_ending_stream(x, r({8}, d, 2), 1e-5, DType::BF16)};
       }},
      {"linear_gelu",
       [=](Device d) {
         return V{linear_gelu(r({2, 3, 4}, d), r({4, 5}, d, 2), r({5}, d, 3))};
       }},
      {"linear_gelu_keeping_input",
       [=](Device d) {
         return V{linear_gelu_keeping_input(r({2, 3, 4}, d), r({4, 5}, d, 2), r({5}, d, 3)).out};
       }},
      {"linear_after_gelu",
       [=](Device d) {
         const GeluOutput h =
             linear_gelu_keeping_input(r({2, 3, 4}, d), r({4, 5}, d, 2), r({5}, d, 3));
         return V{linear_after_gelu(h, r({5, 6}, d, 4), r({6}, d, 5))};
       }},
      {"softmax",
       [=](Device d) {
         return V{softmax(r({2, 4, 4}, d), true), softmax(r({3, 5}, d))};
       }},
      {"causal_attention",
       [=](Device d) {
         Tensor qkv = r({2, 5, 3, 2, 4}, d);  // [B, T, 3, H, D]: q, k, v are strided views
         auto part = [&](int64_t i) {
           return permute(reshape(narrow(qkv, 2, i, 1), {2, 5, 2, 4}), {0, 2, 1, 3});
         };
         return V{causal_attention(part(0), part(1), part(2))};
       }},
      {"causal_attention_packed",
       [=](Device d) {
         return V{causal_attention_packed(r({2, 5, 24}, d), 2)};  // 2 heads of 4
       }},
      {"cross_entropy",
       [=](Device d) {
         return V{cross_entropy(r({6, 5}, d), reshape(tokens(d), {6}))};
       }},
      {"linear_cross_entropy",
       [=](Device d) {
         return V{linear_cross_entropy(r({6, 4}, d), r({5, 4}, d, 2), reshape(tokens(d), {6}))};
       }},
      {"embedding",
       [=](Device d) {
         return V{embedding(tokens(d), r({5, 4}, d))};
       }},
      {"cross_entropy_part",
       [=](Device d) {
         return cross_entropy_part(r({6, 3}, d), reshape(tokens(d), {6}), 2);
       }},
      {"cross_entropy_part_backward",
       [=](Device d) {
         return V{cross_entropy_part_backward(r({6, 3}, d), reshape(tokens(d), {6}), 2,
                                              r({6}, d, 2), r({1}, d, 3))};
       }},
      {"embedding_part",
       [=](Device d) {
         return V{embedding_part(tokens(d), r({3, 4}, d), 2)};
       }},
      {"sum",
       [=](Device d) {
         return V{sum(r({2, 3}, d)), sum(r({2, 3, 4}, d), {0, 2}, true),
                  sum(cast(r({4, 3}, d), DType::BF16), {0}, false, DType::F32)};
       }},
      {"mean",
       [=](Device d) {
         return V{mean(r({2, 3}, d)), mean(r({2, 3}, d), {1})};
       }},
      {"max",
       [=](Device d) {
         return V{max(r({3, 4}, d), 1), max(r({5}, d))};
       }},
      {"sum_to",
       [=](Device d) {
         return V{sum_to(r({2, 3, 4}, d), {3, 1})};
       }},
      {"reshape",
       [=](Device d) {
         return V{reshape(transpose(r({2, 3}, d), 0, 1), {-1})};
       }},
      {"permute",
       [=](Device d) {
         return V{permute(r({2, 3, 4}, d), {2, 0, 1})};
       }},
      {"transpose",
       [=](Device d) {
         return V{transpose(r({2, 3}, d), 0, 1)};
       }},
      {"narrow",
       [=](Device d) {
         return V{narrow(r({4, 3}, d), 0, 1, 2)};
       }},
      {"expand",
       [=](Device d) {
         return V{mul(expand(r({1, 3}, d), {4, 3}), r({4, 3}, d, 2))};
       }},
      {"concat",
       [=](Device d) {
         return V{concat({r({2, 3}, d), r({2, 1}, d, 2)}, 1)};
       }},
      {"split",
       [=](Device d) {
         return split(r({5, 2}, d), {2, 3}, 0);
       }},
      {"contiguous",
       [=](Device d) {
         return V{contiguous(transpose(r({2, 3}, d), 0, 1))};
       }},
      {"cast",
       [=](Device d) {
         return V{cast(cast(r({2, 3}, d), DType::F64), DType::F32)};
       }},
  };
}

// The allocations made on `device` while `run` runs, their peak and what is left: what the
// meta device must reproduce.
struct Footprint {
  size_t allocations = 0;
  size_t peak = 0;
  size_t left = 0;
};

Footprint footprint(Device device, const std::function<void()>& run) {
  Allocator& allocator = allocator_for(device);
  const MemoryStats before = allocator.stats();
  allocator.reset_peak();
  run();
  const MemoryStats after = allocator.stats();
  return {after.allocations - before.allocations, after.peak_bytes - before.current_bytes,
          after.current_bytes - before.current_bytes};
}

TEST(MetaDevice, EveryOpRunsWithTheCpusShapesAndAllocationsAndReportsItsCost) {
  for (const OpCase& c : op_cases()) {
    SCOPED_TRACE(c.op);
    std::vector<Tensor> cpu, meta;
    const Footprint on_cpu = footprint(Device::cpu(), [&] {
      cpu = c.run(Device::cpu());
      if (Tensor total = scalar_sum(cpu); total.defined() && total.requires_grad())
        total.backward();
    });
    CostLog log;
    Footprint on_meta;
    {
      MetaCostScope scope(log);
      on_meta = footprint(Device::meta(), [&] {
        meta = c.run(Device::meta());
        if (Tensor total = scalar_sum(meta); total.defined() && total.requires_grad())
          total.backward();
      });
    }
    ASSERT_EQ(cpu.size(), meta.size());
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_EQ(meta[i].device(), Device::meta());
      EXPECT_EQ(meta[i].shape(), cpu[i].shape()) << "output " << i;
      EXPECT_EQ(meta[i].strides(), cpu[i].strides()) << "output " << i;
      EXPECT_EQ(meta[i].dtype(), cpu[i].dtype()) << "output " << i;
    }
    // The random inputs' fills are the CPU's allocations too (their draws are not).
    EXPECT_EQ(on_meta.allocations, on_cpu.allocations);
    EXPECT_EQ(on_meta.peak, on_cpu.peak);
    EXPECT_EQ(on_meta.left, on_cpu.left);
    EXPECT_FALSE(log.costs.empty());
    for (const OpCost& cost : log.costs) {
      EXPECT_GE(cost.flops, 0);
      EXPECT_GE(cost.bytes_read + cost.bytes_written, 0);
    }
  }
}

// The guard: an op declared in tensor/ops.h that op_cases() does not run fails here, so a new
// op comes with its meta implementation and its check.
TEST(MetaDevice, EveryOpOfTheHeaderIsExercised) {
  std::ifstream header(LOOM_SOURCE_DIR "/tensor/ops.h");
  ASSERT_TRUE(header.good());
  std::stringstream text;
  text << header.rdbuf();
  const std::string source = text.str();
  const std::regex declaration(R"(^(?:Tensor|void|std::vector<Tensor>) (\w+)\()",
                               std::regex::multiline);
  std::set<std::string> exercised;
  for (const OpCase& c : op_cases())
    exercised.insert(c.op);
  int declared = 0;
  for (auto it = std::sregex_iterator(source.begin(), source.end(), declaration);
       it != std::sregex_iterator(); ++it) {
    ++declared;
    EXPECT_TRUE(exercised.count((*it)[1].str())) << (*it)[1].str() << " has no meta check";
  }
  EXPECT_GT(declared, 30);
}

// The optimizer step as each path runs it: on the CPU's, a gradient norm and an AdamW update
// per tensor; following CUDA's (a simulated GPU rank), the fused launches: the sums of squares
// (a pass over every gradient, then a finish) and one AdamW over all tensors, so that loom-sim
// charges 3 launches' overheads and one copy, not 2 launches per tensor. (A meta norm reads as
// 0: nothing is scaled.)
TEST(MetaDevice, TheOptimizerStepReportsTheLaunchesOfItsPath) {
  for (const bool cuda_path : {false, true}) {
    SCOPED_TRACE(cuda_path ? "CUDA's path" : "the CPU's path");
    std::vector<Tensor> params;
    for (int64_t n : {3, 5, 8, 13}) {
      params.push_back(Tensor::empty({n, 2}, DType::F32, Device::meta()).set_requires_grad(true));
      params.back().set_grad(Tensor::empty({n, 2}, DType::F32, Device::meta()));
    }
    optim::AdamW adamw(params);
    CostLog log;
    {
      std::optional<MetaCudaPathScope> cuda;
      if (cuda_path) cuda.emplace();
      adamw.step();  // the first step makes the moments (fills): the steady step is counted
      MetaCostScope scope(log);
      EXPECT_EQ(optim::clip_grad_norm(params, 1.0), 0.0);
      adamw.step();
    }
    std::map<std::string, int> ops;
    double adamw_bytes = 0;
    for (const OpCost& c : log.costs) {
      ++ops[c.op];
      if (std::string(c.op) == "adamw") adamw_bytes += c.bytes_read + c.bytes_written;
    }
    const std::map<std::string, int> want =
        cuda_path ? std::map<std::string, int>{{"multi_tensor_sum_of_squares", 1},
                                               {"finish_sums_of_squares", 1},
                                               {"copy_across_devices", 1},  // the sums, to the host
                                               {"adamw", 1}}
                  : std::map<std::string, int>{{"grad_norm", 4}, {"adamw", 4}};
    EXPECT_EQ(ops, want);
    // Either way AdamW reads the parameter, gradient and two moments and writes three.
    EXPECT_EQ(adamw_bytes, (3 + 5 + 8 + 13) * 2 * 4.0 * 7);
  }
}

TEST(MetaDevice, GemmAndAttentionCostTheirClosedForms) {
  CostLog log;
  MetaCostScope scope(log);
  Tensor a = Tensor::empty({2, 4, 3}, DType::F32, Device::meta());
  Tensor b = Tensor::empty({2, 3, 5}, DType::F32, Device::meta());
  matmul(a, b);
  ASSERT_EQ(log.costs.size(), 1u);
  EXPECT_EQ(log.costs[0].op_class, OpClass::Gemm);
  EXPECT_EQ(log.costs[0].flops, 2.0 * 2 * 4 * 5 * 3);
  EXPECT_EQ(log.costs[0].dims, (std::array<int64_t, 4>{4, 5, 3, 2}));
  EXPECT_EQ(log.costs[0].bytes_read, (2 * 4 * 3 + 2 * 3 * 5) * 4.0);
  EXPECT_EQ(log.costs[0].bytes_written, 2 * 4 * 5 * 4.0);

  log.costs.clear();
  Tensor q = Tensor::empty({2, 3, 7, 8}, DType::F32, Device::meta());
  causal_attention(q, q, q);
  ASSERT_EQ(log.costs.size(), 1u);
  EXPECT_EQ(log.costs[0].op_class, OpClass::Attention);
  // QK^T and PV over the 7 * 8 / 2 = 28 causal pairs of each of 2 * 3 heads, 8 wide.
  EXPECT_EQ(log.costs[0].flops, 2.0 * 2 * 2 * 3 * 28 * 8);
}

// Causal attention keeps its output and each row's logsumexp for backward, never the
// [B, H, T, T] probabilities, on the CPU's path and CUDA's alike; its work is the same on both.
// Grouped key/value heads (here 2 for 4 query heads) are taken as they are on both paths
// (CUDA's, MetaCudaPathScope, repeated them first until its kernels took them, 2026-12-06).
TEST(MetaDevice, CausalAttentionKeepsTheLogsumexpAndGroupedHeadsAsTheyAreOnBothPaths) {
  const auto kept_bytes = [](bool cuda) {
    std::optional<MetaCudaPathScope> path;
    if (cuda) path.emplace();
    CostLog log;
    MetaCostScope scope(log);
    Tensor q = Tensor::empty({2, 4, 7, 8}, DType::F32, Device::meta()).set_requires_grad(true);
    Tensor kv = Tensor::empty({2, 2, 7, 8}, DType::F32, Device::meta()).set_requires_grad(true);
    Allocator& meta = allocator_for(Device::meta());
    const size_t before = meta.stats().current_bytes;
    Tensor out = causal_attention(q, kv, kv);
    const size_t kept = meta.stats().current_bytes - before;
    sum(out).backward();
    const auto attention = std::find_if(log.costs.begin(), log.costs.end(), [](const auto& c) {
      return c.op_class == OpClass::Attention;
    });
    EXPECT_NE(attention, log.costs.end());
    if (attention != log.costs.end()) {
      EXPECT_EQ(attention->flops, 2.0 * 2 * 2 * 4 * 28 * 8);
    }
    return kept;
  };
  const size_t out_bytes = 2 * 4 * 7 * 8 * 4, lse_bytes = 2 * 4 * 7 * 4;
  EXPECT_EQ(kept_bytes(false), out_bytes + lse_bytes);
  EXPECT_EQ(kept_bytes(true), out_bytes + lse_bytes);  // no repeated k and v (2026-12-06)
}

// The small models the step tests train, on `device`.
nn::GPTConfig small_gpt(Device device) {
  nn::GPTConfig c;
  c.vocab_size = 10;
  c.context = 8;
  c.layers = 2;
  c.heads = 2;
  c.embd = 16;
  c.options.device = device;
  return c;
}

nn::LlamaConfig small_llama(Device device) {
  nn::LlamaConfig c;
  c.vocab_size = 10;
  c.context = 8;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.hidden = 16;
  c.intermediate = 24;
  c.options.device = device;
  return c;
}

// The FLOPs a training step's GEMMs and attention report, against the closed forms: every
// matrix product runs forward (2mnk) and backward for its input and its weight (2mnk each),
// so 6 x tokens x the weights that multiply; causal attention 6 x B x (heads x head dim) x
// T(T+1) per layer (QK^T and PV over the causal pairs, backward twice the forward).
struct StepFlops {
  double gemm = 0, attention = 0;
};

StepFlops step_flops(nn::CausalLM& model, int64_t batch, int64_t time) {
  MetaCostTotals totals;
  MetaCostScope scope(totals);
  const Tensor tokens = Tensor::zeros({batch, time}, DType::I64, Device::meta());
  model.loss(tokens, tokens).backward();
  return {totals.of(OpClass::Gemm).flops, totals.of(OpClass::Attention).flops};
}

TEST(MetaDevice, ATrainingStepsGemmAndAttentionFlopsAreTheClosedForms) {
  const double B = 3, T = 8, L = 2;
  {
    nn::GPT gpt(small_gpt(Device::meta()), 0);
    const double C = 16, V = 10;
    const StepFlops f = step_flops(gpt, 3, 8);
    EXPECT_EQ(f.gemm, 6 * B * T * (L * 12 * C * C + V * C));  // qkv, proj, fc, fc proj; head
    EXPECT_EQ(f.attention, L * 6 * B * C * T * (T + 1));
  }
  {
    nn::LlamaConfig c = small_llama(Device::meta());
    c.head_dim = 8;  // heads x head_dim = 32, unlike hidden
    nn::Llama llama(c, 0);
    const double C = 16, HD = 32, KVD = 16, I = 24, V = 10;
    const StepFlops f = step_flops(llama, 3, 8);
    EXPECT_EQ(f.gemm, 6 * B * T * (L * (C * HD + 2 * C * KVD + HD * C + 3 * C * I) + C * V));
    EXPECT_EQ(f.attention, L * 6 * B * HD * T * (T + 1));
  }
}

TEST(MetaDevice, ValuesReadAsZerosAndDataAccessIsANamedError) {
  Tensor t = Tensor::full({3}, 2.0, DType::F32, Device::meta());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(sum(t).item(), 0.0);
  try {
    (void)t.data<float>();
    FAIL() << "data() of a meta tensor did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Tensor(f32, [3], meta)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no meta implementation"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Device::parse("meta"), Device::meta());
  EXPECT_EQ(Device::meta().str(), "meta");
}

// Peak and final bytes per MemoryKind over `steps` training steps of `model` (built on
// `device` by `make`), from the device's allocator: the meta run must equal the CPU run.
using Kinds = std::array<size_t, kMemoryKindCount>;
struct StepMemory {
  Kinds after_build{}, peak{}, after_steps{};
  size_t step_allocations = 0;
};

// The tokens live on `device` (GPT's positions follow them), as a trainer moves them there.
StepMemory train_steps(Device device, const std::function<std::unique_ptr<nn::CausalLM>()>& make,
                       const Tensor& host_tokens, const Tensor& host_targets, int steps) {
  const Tensor tokens = host_tokens.to(device), targets = host_targets.to(device);
  Allocator& allocator = allocator_for(device);
  const Kinds before = allocator.stats().current_by_kind;
  auto minus = [&](const Kinds& k) {
    Kinds out{};
    for (size_t i = 0; i < kMemoryKindCount; ++i)
      out[i] = k[i] - before[i];
    return out;
  };
  StepMemory m;
  std::unique_ptr<nn::CausalLM> model = make();
  optim::AdamWOptions options;
  options.weight_decay = 0.1;
  optim::AdamW optimizer(model->parameters(), options);
  m.after_build = minus(allocator.stats().current_by_kind);
  allocator.reset_peak();
  const size_t allocations = allocator.stats().allocations;
  Tensor loss;
  for (int step = 0; step < steps; ++step) {
    loss = model->loss(tokens, targets);
    loss.backward();
    optim::clip_grad_norm(model->parameters(), 1.0);
    optimizer.step();
    optimizer.zero_grad();
  }
  m.peak = minus(allocator.stats().peak_by_kind);
  m.after_steps = minus(allocator.stats().current_by_kind);
  m.step_allocations = allocator.stats().allocations - allocations;
  EXPECT_TRUE(std::isfinite(loss.item()));  // read after the peak: its host copy is no step's
  return m;
}

void expect_meta_matches_cpu(const std::function<std::unique_ptr<nn::CausalLM>(Device)>& make) {
  Tensor tokens =
      Tensor::from_vector<int64_t>({1, 5, 2, 7, 3, 3, 0, 6, 4, 2, 1, 9, 8, 0, 2, 5}, {2, 8});
  Tensor targets =
      Tensor::from_vector<int64_t>({5, 2, 7, 3, 3, 0, 6, 4, 2, 1, 9, 8, 0, 2, 5, 1}, {2, 8});
  const StepMemory cpu = train_steps(
      Device::cpu(), [&] { return make(Device::cpu()); }, tokens, targets, 2);
  MetaCostTotals totals;
  MetaCostScope scope(totals);
  const StepMemory meta = train_steps(
      Device::meta(), [&] { return make(Device::meta()); }, tokens, targets, 2);
  for (size_t k = 0; k < kMemoryKindCount; ++k) {
    const char* kind = memory_kind_name(static_cast<MemoryKind>(k));
    EXPECT_EQ(meta.after_build[k], cpu.after_build[k]) << kind;
    EXPECT_EQ(meta.peak[k], cpu.peak[k]) << kind;
    EXPECT_EQ(meta.after_steps[k], cpu.after_steps[k]) << kind;
  }
  EXPECT_EQ(meta.step_allocations, cpu.step_allocations);
  EXPECT_GT(cpu.peak[static_cast<size_t>(MemoryKind::Activations)], 0u);
  EXPECT_GT(cpu.after_steps[static_cast<size_t>(MemoryKind::OptimizerState)], 0u);
  EXPECT_GT(totals.of(OpClass::Gemm).flops, 0);
  EXPECT_GT(totals.of(OpClass::Optimizer).ops, 0);
}

TEST(MetaDevice, AGpt2TrainingStepPeaksAtTheCpuRunsBytesKindByKind) {
  expect_meta_matches_cpu(
      [](Device device) { return std::make_unique<nn::GPT>(small_gpt(device), 3); });
}

TEST(MetaDevice, ALlamaTrainingStepPeaksAtTheCpuRunsBytesKindByKind) {
  expect_meta_matches_cpu(
      [](Device device) { return std::make_unique<nn::Llama>(small_llama(device), 3); });
}


// Note [Profiling CPU ops]: a profiled CPU step reports the ops a meta step reports (but the
// meta run's reads of tokens to the host), in the same order with the same costs, each with its
// time; so the two can be zipped.
// Two training steps of make(device), reporting to `sink` (an OpProfile when `profile`).
void run_steps(Device device, const std::function<std::unique_ptr<nn::CausalLM>(Device)>& make,
               MetaCostSink& sink, bool profile) {
  std::unique_ptr<nn::CausalLM> model = make(device);
  optim::AdamW optimizer(model->parameters());
  Tensor tokens = Tensor::zeros({2, 8}, DType::I64, device);
  std::optional<OpProfileScope> profiling;
  std::optional<MetaCostScope> scope;
  if (profile) {
    profiling.emplace(static_cast<OpProfile&>(sink));
  } else {
    scope.emplace(sink);
  }
  for (int step = 0; step < 2; ++step) {
    model->loss(tokens, tokens).backward();
    optim::clip_grad_norm(model->parameters(), 1e9);  // never clips: the same ops both ways
    optimizer.step();
    optimizer.zero_grad();
  }
}

void expect_profile_matches_meta(const std::function<std::unique_ptr<nn::CausalLM>(Device)>& make) {
  CostLog log;
  run_steps(Device::meta(), make, log, false);
  // Less the meta run's reads to the host (token indices), which the CPU run does not make.
  CostLog meta;
  for (const OpCost& cost : log.costs) {
    if (std::string(cost.op) != "copy_across_devices") meta.costs.push_back(cost);
  }
  ASSERT_GT(log.costs.size(), meta.costs.size());  // the tokens and targets each step, ...
  OpProfile profile;
  run_steps(Device::cpu(), make, profile, true);
  EXPECT_EQ(profile.entries().size(), meta.costs.size());
  double total = 0;
  for (size_t i = 0; i < std::min(meta.costs.size(), profile.entries().size()); ++i) {
    const OpCost& cpu = profile.entries()[i].cost;
    SCOPED_TRACE(std::to_string(i) + ": " + meta.costs[i].op);
    ASSERT_STREQ(cpu.op, meta.costs[i].op);
    EXPECT_EQ(cpu.op_class, meta.costs[i].op_class);
    EXPECT_EQ(cpu.flops, meta.costs[i].flops);
    // (A linear layer's GEMM reads its bias on meta, as CUDA's epilogue does, and its output,
    // which holds the bias, on the CPU: matmul.cpp.)
    if (cpu.op_class != OpClass::Gemm) {
      EXPECT_EQ(cpu.bytes_read, meta.costs[i].bytes_read);
    }
    EXPECT_TRUE(cpu.on_host);
    EXPECT_FALSE(meta.costs[i].on_host);
    EXPECT_EQ(cpu.bytes_written, meta.costs[i].bytes_written);
    EXPECT_GE(profile.entries()[i].seconds, 0);
    total += profile.entries()[i].seconds;
  }
  EXPECT_GT(total, 0);
  EXPECT_FALSE(detail::profiling_cpu_ops);  // the scope ended
}

TEST(MetaDevice, AProfiledCpuStepReportsTheMetaStepsOpsInOrderWithTheirTimes) {
  expect_profile_matches_meta(
      [](Device device) { return std::make_unique<nn::GPT>(small_gpt(device), 3); });
  expect_profile_matches_meta(
      [](Device device) { return std::make_unique<nn::Llama>(small_llama(device), 3); });
}

}  // namespace
}  // namespace loom
