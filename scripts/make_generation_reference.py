#!/usr/bin/env python3
"""Writes the greedy-decoding reference that Loom's nn::generate is held to (issue 44,
item 5): the tiny Llama and GPT-2 of scripts/make_llama_reference.py, trained here for 150
steps on the peers' LCG data (so that their next-token logits have clear margins), saved with
save_pretrained to tests/data/llama_tiny_trained/ and gpt2_tiny_trained/, and transformers'
`generate(do_sample=False)` tokens for a few prompts in tests/data/generation_reference.json,
with the smallest gap between the two largest logits over every generated step (prompts whose
gap falls below 0.05 are left out: there the order could turn on rounding).

    /tmp/peers-venv/bin/python scripts/make_generation_reference.py
"""
import json
import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench", "peers", "python"))
# Where the files go: tests/data, or LOOM_REFERENCE_OUT (bench/models/recheck_references.py
# writes them elsewhere to compare with the checked-in ones).
OUT = os.environ.get("LOOM_REFERENCE_OUT", os.path.join(ROOT, "tests", "data"))

import torch  # noqa: E402
import transformers  # noqa: E402
from harness import lcg_batch  # noqa: E402

NEW_TOKENS = 40


def train(model, ctx, steps=150):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
    for step in range(steps):
        x, y = lcg_batch(step, 0, 16, ctx)
        opt.zero_grad(set_to_none=True)
        logits = model(x).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).backward()
        opt.step()
    return model.eval()


def greedy(model, prompts):
    out = []
    for prompt in prompts:
        result = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW_TOKENS,
                                output_scores=True, return_dict_in_generate=True,
                                pad_token_id=0)
        gap = min(float((s[0].topk(2).values[0] - s[0].topk(2).values[1])) for s in result.scores)
        if gap < 0.05:
            continue
        out.append({"prompt": prompt, "tokens": result.sequences[0, len(prompt):].tolist(),
                    "smallest_top2_gap": gap})
    return out


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attn_implementation="eager"))
    torch.manual_seed(1)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None))
    # Prompts: the start of LCG sequences, and a few that break the pattern.
    prompts = [[int((977 * 7 + 131 * i + 17) % 256)] for i in range(4)]
    prompts += [[3, 18, 93, 212], [100, 200, 44, 9, 250, 1], [0, 0, 0, 0, 0]]
    out = {"what": "transformers generate(do_sample=False), 40 new tokens, from the trained tiny "
                   "models in tests/data/{llama,gpt2}_tiny_trained",
           "transformers": transformers.__version__, "torch": torch.__version__,
           "python": platform.python_version(),
           "command": "/tmp/peers-venv/bin/python scripts/make_generation_reference.py"}
    for name, model in (("llama", llama), ("gpt2", gpt2)):
        train(model, 64)
        directory = os.path.join(OUT, f"{name}_tiny_trained")
        model.save_pretrained(directory, safe_serialization=True)
        gen_config = os.path.join(directory, "generation_config.json")
        if os.path.exists(gen_config):
            os.remove(gen_config)
        out[name] = greedy(model, prompts)
        print(name, [(len(c["prompt"]), round(c["smallest_top2_gap"], 3)) for c in out[name]])
    with open(os.path.join(OUT, "generation_reference.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
