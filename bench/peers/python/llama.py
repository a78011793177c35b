"""The Llama peer: Hugging Face transformers' LlamaForCausalLM (its default attention, torch's
scaled_dot_product_attention), the model a PyTorch user trains a Llama with, wrapped to take
(inputs, targets) as gpt.py's GPT does. Loom's `--model llama` builds the same architecture
(RMSNorm, rotary positions, SwiGLU, grouped-query attention) and loads these weights from the
directory `save_pretrained` writes (vs_torch.sh's --init).

Initialisation: transformers' own (every Linear and Embedding weight N(0, initializer_range
0.02), RMSNorm weights 1) under torch.manual_seed(seed), so the weights depend on the seed and
the configuration only. Needs transformers (bench/models/setup.sh installs it).
"""
import torch
from torch import nn
from torch.nn import functional as F


class CausalLoss(nn.Module):
    """forward(idx, targets) -> the mean cross-entropy over every position, targets already
    shifted (the harness's batches), as gpt.py's GPT; forward(idx) -> the logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets=None):
        logits = self.model(input_ids=idx, use_cache=False).logits
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))


def make_llama(a, seed=0):
    """The Llama of the harness's flags (--layers, --heads, --embd, --ctx, --vocab, --kv-heads,
    --intermediate, --tie-embeddings), wrapped in CausalLoss."""
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.embd, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         num_key_value_heads=a.kv_heads, max_position_embeddings=a.ctx,
                         rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=a.tie_embeddings, attention_bias=False,
                         mlp_bias=False)
    torch.manual_seed(seed)
    return CausalLoss(LlamaForCausalLM(config))
