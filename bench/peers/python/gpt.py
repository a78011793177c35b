"""The model every Python peer trains: a GPT-2 in PyTorch, the same one Loom's `nn` GPT
builds, so a peer's losses are an exact oracle for Loom's and its step time a fair peer.

Contract (docs/performance.md, docs/sharding.md and docs/parallelism.md quote numbers that
depend on every point; change none without re-measuring them):
- pre-LN blocks, x + attn(ln_1(x)) then x + mlp(ln_2(x)); final ln_f;
- attention: one fused `c_attn` Linear for q, k, v, causal scaled_dot_product_attention;
- MLP: 4x width, tanh-approximated GELU;
- learned position embeddings `wpe`; the head shares `wte`'s weight (tied);
- parameter names are Hugging Face GPT-2's (`wte`, `h.0.attn.c_attn`, ...), but the Linear
  weights keep torch's [out, in] layout, not GPT-2's Conv1D [in, out];
- initialisation under torch.manual_seed(seed): every Linear and Embedding weight N(0, 0.02),
  biases 0, the residual projections (`c_proj`) N(0, 0.02 / sqrt(2 * layers)). The draws
  happen in module order after construction, so the weights depend on the seed and the
  configuration only; reorder the modules and every peer's losses change.
"""
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 2
    heads: int = 4
    embd: int = 64
    ctx: int = 64
    vocab: int = 256


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads = cfg.heads
        self.c_attn = nn.Linear(cfg.embd, 3 * cfg.embd)  # q, k and v in one GEMM
        self.c_proj = nn.Linear(cfg.embd, cfg.embd)

    def forward(self, x):
        b, t, c = x.shape

        def by_head(z):  # [b, t, c] -> [b, heads, t, c / heads]
            return z.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        q, k, v = map(by_head, self.c_attn(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.embd, 4 * cfg.embd)
        self.c_proj = nn.Linear(4 * cfg.embd, cfg.embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    """One transformer layer; FSDP's wrap unit and the pipeline's unit of placement."""

    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.embd)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.embd)
        self.wpe = nn.Embedding(cfg.ctx, cfg.embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.embd)
        self.lm_head = nn.Linear(cfg.embd, cfg.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one tensor, two names
        self._init_weights()

    def _init_weights(self):
        # modules() visits wte, wpe, each block's Linears, then lm_head (whose draw lands in
        # the tied wte weight): the order of the draws is part of the contract above.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, 0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * self.cfg.layers)
        for block in self.h:
            nn.init.normal_(block.attn.c_proj.weight, 0.0, residual_std)
            nn.init.normal_(block.mlp.c_proj.weight, 0.0, residual_std)

    def forward(self, idx, targets=None):
        """idx, targets: [batch, t] int64. Returns the logits, or with targets the mean
        cross-entropy over every position."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_model(cfg, seed=0):
    """The model with the contract's initial weights for `seed` (every rank gets the same)."""
    torch.manual_seed(seed)
    return GPT(cfg)
