#!/usr/bin/env python3
"""Trains the small tokenizers checked in under tests/data/tokenizers/ (the real GPT-2 and
Llama 3 files are not downloaded by the tests): byte-level BPE of about 3,000 tokens on the
project's docs/*.md and a multilingual sample, with each family's exact pre-tokenizer,
split regex, special tokens and decoder.

    .venv/bin/python tests/text/make_tokenizers.py        # scripts/install-deps.sh makes .venv

  gpt2-style/tokenizer.json    ByteLevel(use_regex) as GPT-2's file: merges as "a b" strings,
                               <|endoftext|> the last token of the vocabulary and an added
                               token with "normalized": true, as in GPT-2's file.
  llama3-style/tokenizer.json  Split(Llama 3's regex) + ByteLevel, ignore_merges, the 256
                               special tokens of Llama 3 after the vocabulary, merges as
                               ["a", "b"] pairs (what tokenizers writes since 0.20).
Training is deterministic for a given tokenizers version; a rerun may still differ from the
checked-in files after an upgrade, and the tests' expected ids come from the files as they are.
"""
import json
import pathlib

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "tokenizers"
VOCAB = 3000

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# A little of many scripts, so that the vocabulary holds multi-byte tokens of each.
MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog. It's 42 degrees; we'll see what they've done.",
    "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Maße und Straßen.",
    "Le vif renard brun saute par-dessus le chien paresseux. « Où est-il ? » demanda-t-elle.",
    "El veloz murciélago hindú comía feliz cardillo y kiwi. ¿Dónde está la estación?",
    "Быстрая коричневая лиса прыгает через ленивую собаку. Съешь же ещё этих мягких булок.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο. Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "敏捷的棕色狐狸跳过了懒狗。我们今天学习分布式训练和张量并行。",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ。東京は日本の首都です。",
    "다람쥐 헌 쳇바퀴에 타고파. 서울은 한국의 수도입니다.",
    "نص حكيم له سر قاطع وذو شأن عظيم مكتوب على ثوب أخضر ومغلف بجلد أزرق.",
    "עטלף אבק נס דרך מזגן שהתפוצץ כי חם. שלום עולם!",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम।",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "Pchnąć w tę łódź jeża lub ośm skrzyń fig. Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Emoji: 😀😃😄 👩‍👩‍👧‍👦 🇫🇷🇯🇵 ✨🚀🔥 — and math: ∑ᵢ xᵢ² ≤ ∞, ½ + ¼ = ¾, 2³ = 8.",
    "Digits of many kinds: 0123456789 ٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ０１２３４５６７８９ Ⅻ ⅷ.",
    "def train(model, steps=100):\n\tfor step in range(steps):\n\t\tloss = model(x)\r\n\t\tloss.backward()\n",
    "Whitespace\u00a0non-breaking,\u2003em space,\u3000ideographic space, tabs\t\tand\n\n\nnewlines.",
    "I'M SURE HE'S RIGHT, YOU'RE WRONG, THEY'LL KNOW, WE'VE SEEN IT, I'D SAY SO; Don'T mIx'S cAsE.",
]


def corpus():
    for path in sorted((ROOT / "docs").glob("*.md")):
        yield path.read_text(encoding="utf-8")
    for round_ in range(20):
        for line in MULTILINGUAL:
            yield f"{line} {round_ * 37 + 11}\n"


def train(pre_tokenizer):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    return json.loads(tokenizer.to_str())


def write(name, config):
    text = json.dumps(config, ensure_ascii=False, indent=1)
    Tokenizer.from_str(text)  # tokenizers must read it back
    path = OUT / name / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    print(f"{path.relative_to(ROOT)}: {len(config['model']['vocab'])} model tokens, "
          f"{len(config['added_tokens'])} added, {path.stat().st_size} bytes")


def merges_as_pairs(merges):
    return [m.split(" ") if isinstance(m, str) else list(m) for m in merges]


def gpt2_style():
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    config = train(pre)
    model = config["model"]
    model["merges"] = [" ".join(pair) for pair in merges_as_pairs(model["merges"])]
    eot = len(model["vocab"])
    model["vocab"]["<|endoftext|>"] = eot
    config["added_tokens"] = [{"id": eot, "content": "<|endoftext|>", "single_word": False,
                               "lstrip": False, "rstrip": False, "normalized": True,
                               "special": True}]
    config["post_processor"] = json.loads(processors.ByteLevel(trim_offsets=False).__getstate__())
    write("gpt2-style", config)


LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
                    "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"] +
                   [f"<|reserved_special_token_{i}|>" for i in range(3, 248)])


def add_unmerged_words(config, pre):
    """Llama 3's vocabulary (converted from tiktoken) has words that its merges do not build:
    only ignore_merges makes them one token. The trained vocabulary has none, so this adds
    the 32 most frequent words of the corpus that the merges split, as tokens without merges."""
    bpe = Tokenizer.from_str(json.dumps(config))
    counts = {}
    for text in corpus():
        for word, _ in pre.pre_tokenize_str(text):
            counts[word] = counts.get(word, 0) + 1
    vocab = config["model"]["vocab"]
    split_words = [w for w in sorted(counts, key=lambda w: (-counts[w], w))
                   if w not in vocab and len(bpe.encode(w.replace("Ġ", " ")).ids) > 1]
    # Pre-tokens come back in the byte-level alphabet; encode() above wants plain text, and
    # words with other mapped bytes (newlines, tabs) are left out.
    split_words = [w for w in split_words if all(c == "Ġ" or c.isalpha() for c in w)][:32]
    for word in split_words:
        vocab[word] = len(vocab)


def llama3_style():
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    config = train(pre)
    model = config["model"]
    add_unmerged_words(config, pre)
    model["ignore_merges"] = True
    model["merges"] = merges_as_pairs(model["merges"])
    size = len(model["vocab"])
    assert len(LLAMA3_SPECIALS) == 256
    config["added_tokens"] = [{"id": size + i, "content": content, "single_word": False,
                               "lstrip": False, "rstrip": False, "normalized": False,
                               "special": True} for i, content in enumerate(LLAMA3_SPECIALS)]
    config["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>",
                                                 "ids": [size], "tokens": ["<|begin_of_text|>"]}},
    }
    write("llama3-style", config)


if __name__ == "__main__":
    gpt2_style()
    llama3_style()
