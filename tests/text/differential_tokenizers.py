#!/usr/bin/env python3
"""Loom's tokenizer (text/) against Hugging Face `tokenizers` on the same tokenizer.json files:
thousands of seeded random strings built to reach every branch of the split regexes, their
ids with special tokens matched and as plain text, decodes of random id sequences (cutting
multi-byte characters), and the class of every code point. Any difference is printed with
the exact string and both answers, and fails the test.

    differential_tokenizers.py TOKENIZE_LINES TOKENIZERS_DIR [--seed N] [--cases N]

Exits 77 (skipped) when this python has no `tokenizers` (scripts/install-deps.sh puts it in
.venv), except under CI=true, where that is a failure.
"""
import argparse
import json
import os
import pathlib
import random
import struct
import subprocess
import sys
import tempfile
import time

import tokenizers_or_skip  # noqa: F401,E402  (exits when tokenizers is missing)
import tokenizers  # noqa: E402
from tokenizers import Regex, Tokenizer, pre_tokenizers  # noqa: E402

GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
WHITE_SPACE = [chr(c) for c in [*range(0x9, 0xE), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                                0x2028, 0x2029, 0x202F, 0x205F, 0x3000]]
# Not White_Space, though some are in other definitions of a space.
NEAR_SPACE = [chr(c) for c in [0x1C, 0x1D, 0x1E, 0x1F, 0x180E, 0x200B, 0x200C, 0x200D, 0x2060,
                               0xFEFF, 0x00AD, 0x034F]]
LETTERS = "aZéßſKÆ" + "ΩжЖאب" + "中日ㄱ가" + "ǅᾈ" + chr(0x1C89) + chr(0x10D4A)  # Lu Ll Lt Lm Lo, new in 16.0
NUMBERS = "0123456789" + "٣७੯໒" + "Ⅻⅷ①⑳½¾²³" + "０９" + chr(0x10D40) + chr(0x1D7CE) + "𐄇"
MARKS = [chr(c) for c in [0x300, 0x301, 0x308, 0x327, 0x20DD, 0x1AB0, 0x0E31, 0x093F, 0x05B0,
                          0xFE0F, 0x1F3FB]]
EMOJI = ["😀", "👩‍👩‍👧‍👦", "🇫🇷", "❤️", "👍🏽", "🏳️‍🌈", "✨", "🫠", "🧑‍💻", "#️⃣"]
PUNCT = list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'") + ["—", "«", "»", "…", "¿", "、", "。", "€", "©"]
CONTRACTIONS = ["s", "t", "re", "ve", "m", "ll", "d"]
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
            "<|reserved_special_token_3|>", "<|start_header_id|>"]
# Added tokens for the "gpt2-added" variant: overlapping contents (leftmost-longest, and the
# order of the two passes: "normalized": false first), special and not, one that is a model
# token ("Ġthe": its own id), one in the byte-level alphabet ("Ġhello" decodes to " hello")
# and one outside it ("hello world" decodes to itself).
EXTRA_ADDED = [  # content, special, normalized
    ("ab", False, False), ("abc", True, False), ("bcd", False, True), ("cd", True, True),
    ("<mask>", True, True), ("Ġthe", False, False), ("Ġhello", False, False),
    ("hello world", True, False), ("日本", False, True), ("本語", False, False),
    ("<|tag|>", True, False), ("tag", False, False),
]
PLANES = list(range(17))


def random_code_point(rng, plane=None):
    plane = rng.choice(PLANES) if plane is None else plane
    while True:
        cp = plane * 0x10000 + rng.randrange(0x10000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def mixed_case(rng, text):
    return "".join(c.upper() if rng.random() < 0.5 else c for c in text)


class Generator:
    """Random strings, each kind aimed at some branch of the two patterns."""

    def __init__(self, rng, vocab_words, added):
        self.rng = rng
        self.vocab_words = vocab_words
        self.added = SPECIALS + added

    def piece(self):
        rng = self.rng
        kind = rng.randrange(15)
        if kind == 0:
            return "".join(random_code_point(rng) for _ in range(rng.randint(1, 6)))
        if kind == 1:
            plane = rng.choice([0, 0, 0, 1, 2, 3, 14, 15, 16])
            return "".join(random_code_point(rng, plane) for _ in range(rng.randint(1, 6)))
        if kind == 2:
            return "".join(rng.choice(WHITE_SPACE) for _ in range(rng.randint(1, 5)))
        if kind == 3:
            return rng.choice(NEAR_SPACE)
        if kind == 4:
            c = rng.choice(CONTRACTIONS)
            c = mixed_case(rng, c) if rng.random() < 0.7 else c.replace("s", "ſ")
            return "'" + c
        if kind == 5:
            return "".join(rng.choice(NUMBERS) for _ in range(rng.randint(1, 8)))
        if kind == 6:
            breaks = ["\n", "\r", "\r\n", " ", "\t", "\n\n"]
            return "".join(rng.choice(breaks) for _ in range(rng.randint(1, 4)))
        if kind == 7:
            return rng.choice(EMOJI)
        if kind == 8:
            return rng.choice(LETTERS + " '") + "".join(rng.choice(MARKS) for _ in range(rng.randint(1, 3)))
        if kind == 9:
            return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
        if kind == 10:
            return "".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 8)))
        if kind == 11:
            return rng.choice(self.vocab_words)
        if kind == 12:
            token = rng.choice(self.added)
            if rng.random() < 0.7 or len(token) < 2:
                return token
            a = rng.randrange(len(token) - 1)
            return token[a:rng.randint(a + 1, len(token))]
        if kind == 13:  # added tokens and pieces of them run together: overlaps
            out = ""
            for _ in range(rng.randint(2, 4)):
                token = rng.choice(self.added)
                a = rng.randrange(len(token)) if rng.random() < 0.5 else 0
                out += token[a:]
            return out
        return rng.choice(["", " ", "  ", "a", "A", "1", "!", "'"])

    def text(self):
        rng = self.rng
        if rng.random() < 0.03:  # a long word: the heap path of the merges
            return rng.choice(["", " "]) + "".join(rng.choice(self.vocab_words + ["a", "ab", "é"])
                                                   for _ in range(rng.randint(20, 400)))
        return "".join(self.piece() for _ in range(rng.randint(1, 12)))


class Loom:
    """tokenize_lines, one process per batch of requests."""

    def __init__(self, program, tokenizer_json):
        self.program = program
        self.tokenizer_json = tokenizer_json

    def run(self, requests):
        data = b"".join(op + struct.pack("<I", len(payload)) + payload for op, payload in requests)
        proc = subprocess.run([self.program, str(self.tokenizer_json)], input=data,
                              capture_output=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"tokenize_lines failed ({proc.returncode}): {proc.stderr.decode()}")
        out, at, answers = proc.stdout, 0, []
        for op, _ in requests:
            status, count = struct.unpack_from("<BI", out, at)
            at += 5
            if status == 0 and op in (b"e", b"o", b"g", b"l"):
                answers.append(list(struct.unpack_from(f"<{count}I", out, at)))
                at += 4 * count
            else:
                body = out[at:at + count]
                at += count
                answers.append(("error", body.decode()) if status else body)
        return answers


def show_mismatch(what, text, loom, reference, extra=""):
    print(f"MISMATCH {what}: {text!r}\n  loom:       {loom}\n  tokenizers: {reference}{extra}")


def check_classes(loom):
    """The class of every code point, against tokenizers' regex engine (Oniguruma)."""
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    text = "".join(map(chr, cps))
    expected = bytearray(len(cps))  # 0 other, 1 letter, 2 number, 3 space (text/unicode.h)
    for value, pattern in [(1, r"\p{L}"), (2, r"\p{N}"), (3, r"\s")]:
        covered = bytearray(len(cps))
        for _, (a, b) in pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(text):
            covered[a:b] = b"\x01" * (b - a)
        for i, c in enumerate(covered):
            if not c:
                expected[i] = value
    (got,) = loom.run([(b"c", text.encode())])
    bad = [i for i in range(len(cps)) if got[i] != expected[i]]
    for i in bad[:10]:
        print(f"MISMATCH class of U+{cps[i]:04X}: loom {got[i]}, tokenizers {expected[i]}")
    return len(cps), len(bad)


def check_splits(loom, texts):
    """The pre-tokens of both patterns, compared directly: a split in a different place often
    gives the same ids (when no merge crosses either boundary)."""
    checks, mismatches = 0, 0
    for op, pattern in [(b"g", GPT2_PATTERN), (b"l", LLAMA3_PATTERN)]:
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
        answers = loom.run([(op, t.encode()) for t in texts])
        for text, lengths in zip(texts, answers):
            want = [len(p.encode()) for p, _ in split.pre_tokenize_str(text)]
            checks += 1
            if lengths != want:
                mismatches += 1
                if mismatches <= 10:
                    data, at, pieces = text.encode(), 0, []
                    for length in lengths:
                        pieces.append(data[at:at + length].decode(errors="replace"))
                        at += length
                    show_mismatch(f"split by {'GPT-2' if op == b'g' else 'Llama 3'}'s regex", text,
                                  pieces, [p for p, _ in split.pre_tokenize_str(text)])
    return checks, mismatches


def check_tokenizer(name, path, loom_program, rng, cases):
    reference = Tokenizer.from_file(str(path))
    ordinary = Tokenizer.from_file(str(path))
    ordinary.encode_special_tokens = True
    loom = Loom(loom_program, path)
    vocab = reference.get_vocab()
    vocab_size = max(vocab.values()) + 1
    words = [reference.decode([i], skip_special_tokens=False) for i in range(vocab_size)]
    words = [w for w in words if w and "\ufffd" not in w]
    added = [t.content for t in reference.get_added_tokens_decoder().values()]
    gen = Generator(rng, words, added)
    texts = [gen.text() for _ in range(cases)]
    texts += ["", " ", "\n", "'s", "'S", "'ſ", "  x", " \n x", "a\r\n\r\nb", "1234567", "x" * 5000]

    requests = [(b"e", t.encode()) for t in texts] + [(b"o", t.encode()) for t in texts]
    pattern = b"g" if name.startswith("gpt2") else b"l"
    split = pre_tokenizers.Split(Regex(GPT2_PATTERN if pattern == b"g" else LLAMA3_PATTERN),
                                 behavior="isolated")
    # Decodes: random ids (special ones included), and encodings cut anywhere (splitting
    # multi-byte characters between tokens).
    id_lists = [[rng.randrange(vocab_size) for _ in range(rng.randint(0, 12))] for _ in range(cases // 2)]
    multibyte = [t for t in texts if any(ord(c) > 0x7F for c in t)]
    for t in rng.sample(multibyte, min(len(multibyte), cases // 2)):
        ids = reference.encode(t, add_special_tokens=False).ids
        a = rng.randint(0, len(ids))
        id_lists.append(ids[a:a + rng.randint(0, len(ids))])
    for ids in id_lists:
        payload = struct.pack(f"<{len(ids)}I", *ids)
        requests += [(b"d", payload), (b"D", payload)]
    requests.append((b"d", struct.pack("<I", vocab_size)))  # out of range: an error
    answers = loom.run(requests)

    n = len(texts)
    expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    expected += [e.ids for e in ordinary.encode_batch(texts, add_special_tokens=False)]
    mismatches = 0
    for i, (got, want) in enumerate(zip(answers[:2 * n], expected)):
        if got != want:
            mismatches += 1
            text = texts[i % n]
            if mismatches <= 10:
                pieces = [p for p, _ in split.pre_tokenize_str(text)]
                (loom_lengths,) = loom.run([(pattern, text.encode())])
                at, loom_pieces = 0, []
                for length in loom_lengths:
                    loom_pieces.append(text.encode()[at:at + length].decode(errors="replace"))
                    at += length
                show_mismatch(f"{name} encode{'' if i < n else ' (special tokens as text)'}",
                              text, got, want,
                              f"\n  pre-tokens loom:       {loom_pieces}\n  pre-tokens tokenizers: {pieces}")
    decodes = answers[2 * n:-1]
    for k, ids in enumerate(id_lists):
        for skip, got in [(True, decodes[2 * k]), (False, decodes[2 * k + 1])]:
            want = reference.decode(ids, skip_special_tokens=skip).encode("utf-8", "surrogatepass")
            if got != want:
                mismatches += 1
                if mismatches <= 10:
                    show_mismatch(f"{name} decode(skip_special_tokens={skip})", ids, got, want)
    error = answers[-1]
    if not (isinstance(error, tuple) and f"id {vocab_size} at index 0" in error[1]):
        mismatches += 1
        print(f"MISMATCH {name}: decode of id {vocab_size} (out of range) gave {error!r}, expected an error")
    split_checks, split_mismatches = check_splits(loom, texts)
    mismatches += split_mismatches
    checks = 2 * n + 2 * len(id_lists) + 1 + split_checks
    print(f"{name}: {n} strings encoded twice and split by both patterns, {len(id_lists)} id lists "
          f"decoded twice: {checks} checks, {mismatches} mismatches")
    return checks, mismatches


def with_extra_added_tokens(source, target):
    """`source` with EXTRA_ADDED appended to its added tokens, their ids as tokenizers gives them."""
    config = json.loads(source.read_text(encoding="utf-8"))
    vocab = config["model"]["vocab"]
    next_id = max([*vocab.values(), *(t["id"] for t in config["added_tokens"])]) + 1
    for content, special, normalized in EXTRA_ADDED:
        if content in vocab:
            token_id = vocab[content]
        else:
            token_id, next_id = next_id, next_id + 1
        config["added_tokens"].append({"id": token_id, "content": content, "single_word": False,
                                       "lstrip": False, "rstrip": False, "normalized": normalized,
                                       "special": special})
    target.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return target


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("tokenize_lines")
    parser.add_argument("tokenizers_dir", type=pathlib.Path)
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--cases", type=int, default=2500)
    args = parser.parse_args()
    start = time.monotonic()
    print(f"tokenizers {tokenizers.__version__}, seed {args.seed}")
    total_checks, total_bad = 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: args.tokenizers_dir / name / "tokenizer.json"
                 for name in ["gpt2-style", "llama3-style"]}
        files["gpt2-added"] = with_extra_added_tokens(files["gpt2-style"],
                                                      pathlib.Path(tmp) / "gpt2-added.json")
        for name, path in files.items():
            cases = args.cases if name != "gpt2-added" else args.cases // 2
            checks, bad = check_tokenizer(name, path, args.tokenize_lines,
                                          random.Random(f"{args.seed}/{name}"), cases)
            total_checks += checks
            total_bad += bad
    any_tokenizer = args.tokenizers_dir / "gpt2-style" / "tokenizer.json"
    checks, bad = check_classes(Loom(args.tokenize_lines, any_tokenizer))
    print(f"code point classes: {checks} code points, {bad} mismatches")
    total_checks += checks
    total_bad += bad
    print(f"{total_checks} checks in {time.monotonic() - start:.1f} s: {total_bad} mismatches")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
